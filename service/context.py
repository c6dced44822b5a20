"""What one control-plane process holds: its settings and its database."""

from __future__ import annotations

from dataclasses import dataclass

from service.db import Database
from service.settings import Settings


@dataclass
class ServiceContext:
    settings: Settings
    db: Database

"""What one control-plane process holds: its settings and its database."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.catalog.tokens import TokenAuthority
from service.clock import Clock, system_clock
from service.db import Database
from service.meta.signal import BarrierSignal
from service.settings import Settings


@dataclass
class ServiceContext:
    settings: Settings
    db: Database
    clock: Clock = field(default=system_clock)
    signal: BarrierSignal = field(default_factory=BarrierSignal)
    base_url: str | None = None  # known once the server listens
    auth: TokenAuthority | None = None  # None: authentication is switched off

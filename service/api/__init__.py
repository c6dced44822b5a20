"""HTTP layer: thin routes that validate, call a use case and map the result."""

"""The use cases of the control plane: what a route asks for, above the meta and the
catalog (``docs/architecture.md#layout-and-layers``)."""

"""The synchronous core: no awaits, no I/O. Everything here is unit-tested without a loop."""

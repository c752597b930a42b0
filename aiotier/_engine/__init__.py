"""The engine's await side: the pieces of ``TieringEngine`` that perform I/O for the core."""

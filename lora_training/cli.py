"""CLI commands of lora_training, registered on the root app."""

import typer


def register(app: typer.Typer) -> None:
    """Add this package's commands to the root CLI."""

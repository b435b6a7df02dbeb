"""vramtui's faces: the Textual control centre, the command line, and headless serve mode."""

__version__ = "0.1.0"

"""The `corral` command line (click + rich); the entry point is `corral.cli.main:main`."""

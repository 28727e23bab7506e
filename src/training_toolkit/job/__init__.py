"""The job contract: the config files and environment of one job, read into
an immutable Environment (see docs/architecture.md)."""

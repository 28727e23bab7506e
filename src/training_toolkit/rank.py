"""`python -m training_toolkit.rank`: the rank wrapper's documented command (cluster/rank.py)."""
if __name__ == "__main__":
    import sys

    from .cluster.rank import main

    sys.exit(main())

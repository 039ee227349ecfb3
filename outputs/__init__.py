"""Where a command may write, and how (outputs/safety.py): the one check and the one atomic writer."""

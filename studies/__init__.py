"""Accuracy studies: nested evaluation, layouts, public sets and the MiniRocket baseline."""

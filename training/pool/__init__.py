"""The feature pool of a model whose features do not learn, which it knows only by the contract's pool
hooks (models/contract.py): build (what the pool holds: views of the training windows, the other
splits), transform (one rank's pieces of it), shares (the pieces dealt out among ranks, and every rank
given the whole pool, in memory or on disk), store (the pool on disk of a window store's run)."""

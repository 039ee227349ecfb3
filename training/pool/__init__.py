"""The feature pool: fixed features computed once (build), and kept on disk for a window store's run (store)."""

"""Report generation that runs the project's entry points and summarises what they measured."""

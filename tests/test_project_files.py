"""The project's own files agree with each other: requirement files with pyproject.toml."""
import pytest


def test_requirement_files_are_written_from_pyproject():
    pytest.importorskip("tomllib")  # Python 3.11+
    from scripts.requirements import expected_files, load_pyproject
    from training.config.files import REPO
    for name, text in expected_files(load_pyproject()["project"]).items():
        assert (REPO / name).read_text() == text, f"{name} is stale: run python -m scripts.requirements"

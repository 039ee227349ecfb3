"""`make setup` (scripts/setup_venv.py) from whatever python3 is: an activated venv with torch or without,
a python whose torch comes from a module's PYTHONPATH, the project's own venv, and the failures, each one
`error:` line.

The environments with torch see this test's own packages through a .pth file, as an activated venv or a
module would show its own: nothing is downloaded. The one case that installs torch is pointed at an empty
index with pip's configuration files ignored, so it fails at once, which is what it tests."""
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SETUP = REPO / "scripts" / "setup_venv.py"
OWN_PACKAGES = sysconfig.get_paths()["purelib"]  # where this test's torch and numpy are installed
BASE_PYTHON = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"


def bare_venv(folder, sees_own_packages):
    """A venv without pip; with `sees_own_packages` it imports this test's torch from its own site-packages."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    if sees_own_packages:
        purelib = subprocess.run([str(folder / "bin" / "python"), "-c",
                                  "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        Path(purelib, "installed-here.pth").write_text(OWN_PACKAGES + "\n")
    return folder / "bin" / "python"


def set_up(python, venv, torch_choice="auto", index="", activated=None, **env):
    """Run the set-up as make does, with `activated`'s bin first on PATH as `activate` would put it."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("VIRTUAL_ENV", "PYTHONPATH") and not key.startswith("PIP_")}
    environment["PIP_CONFIG_FILE"] = os.devnull  # only the index the test names: no configured find-links
    if activated is not None:
        environment["VIRTUAL_ENV"] = str(activated)
        environment["PATH"] = f"{activated / 'bin'}{os.pathsep}{environment['PATH']}"
    environment.update(env)
    command = [str(python), str(SETUP), str(venv), torch_choice] + ([index] if index else [])
    return subprocess.run(command, capture_output=True, text=True, env=environment, cwd=REPO, timeout=240)


def imports(python, code):
    environment = {key: value for key, value in os.environ.items() if key not in ("VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=environment).stdout.strip()


def one_error_line(result):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def kept_venv(tmp_path_factory):
    """An activated venv that has torch (in its own site-packages, not its base interpreter's), and the
    project venv set up from it with TORCH=auto."""
    folder = tmp_path_factory.mktemp("setup")
    outer = folder / "activated"
    python = bare_venv(outer, sees_own_packages=True)
    venv = folder / "project-venv"
    return python, outer, venv, set_up(python, venv, activated=outer)


def test_an_activated_venv_with_torch_keeps_its_torch_and_the_project_venv_imports_it(kept_venv):
    python, outer, venv, result = kept_venv
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"torch: keeping this virtual environment's torch {torch.__version__} from {OWN_PACKAGES}" in result.stdout
    assert "Traceback" not in result.stderr
    project_python = venv / "bin" / "python"
    # The project venv's own interpreter (no PATH, no VIRTUAL_ENV) imports the kept torch and the rest.
    assert imports(project_python, "import torch, numpy, sklearn; print(torch.__file__)") == torch.__file__
    assert imports(project_python, "import sys; print(sys.prefix)") == str(venv)


def test_the_project_venv_as_python_updates_itself_and_is_not_removed(kept_venv):
    python, outer, venv, result = kept_venv
    again = set_up(venv / "bin" / "python", venv, activated=venv)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{venv / 'bin' / 'python'} is {venv} itself: updating it (torch: keep)" in again.stdout
    assert imports(venv / "bin" / "python", "import torch; print(torch.__version__)") == torch.__version__


@pytest.mark.skipif(not BASE_PYTHON.exists(), reason=f"no base interpreter at {BASE_PYTHON}")
def test_a_python_whose_torch_a_module_put_on_pythonpath_keeps_it_after_the_module_is_gone(tmp_path):
    if subprocess.run([str(BASE_PYTHON), "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip("the base interpreter has a torch of its own")
    venv = tmp_path / "project-venv"
    result = set_up(BASE_PYTHON, venv, PYTHONPATH=OWN_PACKAGES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"torch: keeping this interpreter's torch {torch.__version__} from {OWN_PACKAGES}" in result.stdout
    assert imports(venv / "bin" / "python", "import torch; print(torch.__file__)") == torch.__file__


def test_a_venv_without_torch_installs_the_pin_and_a_failed_install_is_one_error_line(tmp_path):
    outer = tmp_path / "activated"
    python = bare_venv(outer, sees_own_packages=False)
    empty_index = tmp_path / "empty-index"
    empty_index.mkdir()
    result = set_up(python, tmp_path / "project-venv", index=empty_index.as_uri(), activated=outer)
    assert "torch: installing torch==2.13.0" in result.stdout, result.stdout + result.stderr
    line = one_error_line(result)
    assert f"pip could not install torch==2.13.0 from {empty_index.as_uri()}" in line
    assert "TORCH_INDEX" in line and str(tmp_path / "project-venv" / "setup.log") in line


def test_keep_without_a_torch_and_a_folder_not_made_by_the_set_up_are_refused_and_nothing_is_written(tmp_path):
    outer = tmp_path / "activated"
    python = bare_venv(outer, sees_own_packages=False)
    line = one_error_line(set_up(python, tmp_path / "project-venv", "keep", activated=outer))
    assert "TORCH=keep, but" in line and "cannot import torch" in line and "TORCH=cpu" in line
    assert not (tmp_path / "project-venv").exists()

    users = tmp_path / "my-folder"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    line = one_error_line(set_up(python, users, "cpu", activated=outer))
    assert "is not an environment this set-up made" in line
    assert [path.name for path in users.iterdir()] == ["notes.txt"]
    assert one_error_line(set_up(python, tmp_path / "v", "gpu")).startswith("error: TORCH=gpu: use auto, cpu")

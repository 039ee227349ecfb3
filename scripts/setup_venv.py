"""Create the project's virtual environment and install the pinned dependencies into it.

`make` runs it with $(PYTHON) when the requirements, TORCH or PYTHON changed since the last
install (docs/install.md):

    python3 scripts/setup_venv.py VENV TORCH [TORCH_INDEX]

TORCH:
  auto  keep where this interpreter already imports torch; else cuda where an NVIDIA driver is
        found, cpu where not
  cpu   the pinned torch's CPU build, from PyTorch's CPU index
  cuda  the pinned torch from PyPI (the CUDA build on Linux x86_64), or from TORCH_INDEX
  keep  this interpreter's own torch, wherever it comes from: its own site-packages (a system or
        conda Python, a cluster's module), an activated virtual environment, PYTHONPATH. VENV is
        then a plain venv whose path ends with the folders this interpreter imports packages from,
        so it sees that torch (and what else is there) behind what it installs itself. A venv's
        `--system-site-packages` would not do: it shows the base interpreter's packages, not an
        activated venv's.

Standard library only, and no syntax newer than Python 3.6: it runs before anything is installed,
and an older interpreter should get the one-line version error, not a SyntaxError.
"""
import os
import shutil
import site
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CHOICES = ("auto", "cpu", "cuda", "keep")
KEPT_PATHS_FILE = "kept-environment.pth"  # in VENV's site-packages; the import line runs at start-up


class SetupError(Exception):
    """A set-up that cannot go on: its message is the one line the user reads."""


def torch_pin():
    with open(os.path.join(REPO, "requirements.txt")) as requirements:
        for line in requirements:
            if line.startswith("torch=="):
                return line.strip()
    raise SetupError("requirements.txt pins no torch version; run `python -m scripts.requirements`")


def own_torch():
    """(version, folder it is imported from) of this interpreter's torch, or None where it has none.

    Imported in a child process, so a torch that is found but fails to import counts as none."""
    probe = "import os, torch; print(torch.__version__); print(os.path.dirname(os.path.dirname(torch.__file__)))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if result.returncode != 0:
        return None
    version, folder = result.stdout.strip().splitlines()[-2:]
    return version, folder


def has_nvidia_driver():
    return shutil.which("nvidia-smi") is not None or os.path.exists("/proc/driver/nvidia/version")


def chosen_build(choice, torch_found):
    """What `auto` means here: the interpreter's own torch where it has one, else the build its machine needs."""
    if choice != "auto":
        return choice
    if torch_found:
        return "keep"
    return "cuda" if has_nvidia_driver() else "cpu"


def package_folders(torch_folder):
    """The folders this interpreter imports installed packages from, in its order, and torch's own
    (from PYTHONPATH, say) where it is none of them."""
    folders = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    folders.append(torch_folder)
    kept = []
    for folder in folders:
        if os.path.isdir(folder) and os.path.realpath(folder) not in map(os.path.realpath, kept):
            kept.append(folder)
    return kept


def in_venv(venv, *args):
    if sys.platform == "win32":
        return os.path.join(venv, "Scripts", *args)
    return os.path.join(venv, "bin", *args)


def run_logged(command, log_path, failure):
    """Run a set-up step with its output in the log; a failure is one line naming the log and its last line."""
    with open(log_path, "a") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT)
    if code != 0:
        with open(log_path) as log:
            lines = [line.strip() for line in log if line.strip()]
        last = lines[-1] if lines else "no output"
        raise SetupError(f"{failure} (it said: {last}; all of it in {log_path})")


def make_venv(venv, build):
    """A fresh venv where none is, or where the one there was made for another build; never one that
    sees the base interpreter's packages (keep adds the folders it needs itself)."""
    choice_file = os.path.join(venv, ".torch-choice")
    if os.path.exists(choice_file):
        with open(choice_file) as recorded:
            if recorded.read().strip() != build:
                shutil.rmtree(venv)
    if not os.path.exists(in_venv(venv, "python")):
        if os.path.exists(venv) and os.listdir(venv) and not os.path.exists(choice_file):
            raise SetupError(f"{venv} exists and is not an environment this set-up made; move it, or pass "
                             "VENV=another/folder")
        print(f"creating {venv} (torch: {build})", flush=True)
        try:
            subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except subprocess.CalledProcessError as failure:
            said = [line for line in failure.stdout.splitlines() if line.strip()]
            raise SetupError("{} -m venv could not create {} ({}); on Debian or Ubuntu `apt install python3-venv`, "
                             "or pass PYTHON=another python".format(sys.executable, venv,
                                                                    said[0] if said else "no output")) from None
    with open(choice_file, "w") as recorded:
        recorded.write(build + "\n")


def venv_site_packages(venv):
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    result = subprocess.run([in_venv(venv, "python"), "-c", probe], stdout=subprocess.PIPE, check=True,
                            text=True)
    return result.stdout.strip()


def see_kept_packages(venv, folders):
    """Make the venv see `folders` after its own site-packages; their .pth files count too (site.addsitedir)."""
    line = "import site; " + "; ".join(f"site.addsitedir({folder!r})" for folder in folders)
    with open(os.path.join(venv_site_packages(venv), KEPT_PATHS_FILE), "w") as pth:
        pth.write(line + "\n")


def kept_torch_line(version, folder, pin):
    where = "this virtual environment" if sys.prefix != sys.base_prefix else "this interpreter"
    line = f"torch: keeping {where}'s torch {version} from {folder}"
    pinned = pin.split("==")[1]
    if version.split("+")[0] != pinned:
        line += f" (the tests run on {pinned}: TORCH=cpu or TORCH=cuda installs it)"
    return line


def set_up(venv, choice, index):
    if sys.version_info < (3, 10):  # noqa: UP036 (PYTHON may be any interpreter; the project needs 3.10)
        raise SetupError(f"{sys.executable} is Python {sys.version.split()[0]}; the project needs 3.10 or newer: "
                         "pass PYTHON=python3.11 (or another)")
    if choice not in CHOICES:
        raise SetupError("TORCH={}: use {}".format(choice, ", ".join(CHOICES)))
    pin = torch_pin()
    found = own_torch()
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):
        return install_into_itself(venv, pin, index)
    build = chosen_build(choice, found is not None)
    if build == "keep" and found is None:
        raise SetupError(f"TORCH=keep, but {sys.executable} cannot import torch; activate the environment that has it, "
                         "pass PYTHON=its python, or use TORCH=cpu or TORCH=cuda")
    make_venv(venv, build)
    if build == "keep":
        version, folder = found
        see_kept_packages(venv, package_folders(folder))
        print(kept_torch_line(version, folder, pin), flush=True)
    install(venv, build, pin, index)


def install_into_itself(venv, pin, index):
    """PYTHON is VENV's own python (the project's venv, activated): it is brought up to date as the
    build it was made for, never removed from under the interpreter that runs this."""
    recorded = os.path.join(venv, ".torch-choice")
    build = "keep"
    if os.path.exists(recorded):
        with open(recorded) as choice:
            build = choice.read().strip()
    print(f"{sys.executable} is {venv} itself: updating it (torch: {build})", flush=True)
    install(venv, build, pin, index)


def install(venv, build, pin, index):
    """The pinned torch (but for keep) and the rest of the requirements, into VENV."""
    log_path = os.path.join(venv, "setup.log")
    pip = [in_venv(venv, "python"), "-m", "pip", "install", "--disable-pip-version-check"]
    if build == "keep":
        requirements = "requirements-without-torch.txt"
    else:
        where = index or (CPU_INDEX if build == "cpu" else "PyPI")
        print(f"torch: installing {pin} ({build} build, from {where})", flush=True)
        from_index = ["--index-url", index or CPU_INDEX] if build == "cpu" or index else []
        run_logged(pip + [pin] + from_index, log_path,
                   f"pip could not install {pin} from {where}; check the network, pass TORCH_INDEX=a reachable index, "
                   "or use TORCH=keep with a python that has torch")
        requirements = "requirements.txt"
    run_logged(pip + ["-r", os.path.join(REPO, requirements)], log_path,
               f"pip could not install {requirements}; check the network, or the index pip is configured with")
    print(f"installed into {venv}; 'make train' and 'make test' use it")


def main(argv):
    if len(argv) not in (2, 3):
        print("usage: setup_venv.py VENV TORCH [TORCH_INDEX]", file=sys.stderr)
        return 2
    try:
        set_up(argv[0], argv[1], argv[2] if len(argv) == 3 else "")
    except SetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Where predict.py takes its temperature from: a number, or the calibration.json a training run
or an evaluation wrote (evaluation/calibration.py fits it)."""
import json
import math
from pathlib import Path

from data.provenance import read_json
from evaluation.calibration import CALIBRATION_FILE, TEMPERATURE_RANGE
from outputs.safety import write_atomic
from training.errors import UsageError


def write_calibration(path, temperature, about):
    """calibration.json: the temperature and where it was fitted, for predict.py --temperature FILE."""
    text = json.dumps({"temperature": temperature, **about}, indent=2)
    write_atomic(path, lambda partial: Path(partial).write_text(text))


def temperature_choice(value, checkpoint):
    """predict.py's --temperature: "fit", or the temperature it names ("none" is 1; "run" is the one
    the checkpoint's training run fitted, else 1)."""
    if value == "run":
        return run_temperature(checkpoint)
    return value if value == "fit" else 1.0 if value == "none" else read_temperature(value)


def run_temperature(checkpoint):
    """The temperature in the calibration.json beside `checkpoint` when it was fitted for that file
    (a training run fits one for best.pt on its validation split); 1 where there is none."""
    path = Path(checkpoint).parent / CALIBRATION_FILE
    record = read_json(path)
    if not isinstance(record, dict) or Path(str(record.get("checkpoint"))).name != Path(checkpoint).name:
        return 1.0
    return read_temperature(str(path))


def read_temperature(value):
    """--temperature as a number in TEMPERATURE_RANGE: given as such, or the temperature of a calibration.json."""
    from_file = ""
    try:
        temperature = float(value)
    except ValueError:
        try:
            temperature = float(json.loads(Path(value).read_text())["temperature"])
        except FileNotFoundError:
            raise UsageError(f"--temperature {value} is neither a number nor an existing file") from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--temperature {value} is not a {CALIBRATION_FILE} with a temperature "
                             f"({type(exc).__name__})") from None
        from_file = f"{temperature:g} in {value}"
    low, high = TEMPERATURE_RANGE
    if not (math.isfinite(temperature) and low <= temperature <= high):
        raise UsageError(f"--temperature must be between {low:g} and {high:g} (beyond them every confidence turns "
                         f"uniform, 0 or 1, or NaN), or a {CALIBRATION_FILE} holding one; got {from_file or value}")
    return temperature

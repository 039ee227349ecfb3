"""The GPU issue's targets, each beside the figure of the check that measures it: printed at the end
of a check and at the top of its page. A target without its figure says why (not run, failed)."""
from benchmarks.gpu_check.minirocket import FUSED, FUSED_WAYS

FUSED_WINDOWS_PER_S = 1_000_000  # at batch >= 1,024
STEP_SAMPLES_PER_S = {"cnn1d": 100_000, "minirocket": 150_000}  # at batch 32: cnn1d, the default's head
TRAINER_OF_MINIMAL = 0.97
COLD_START_S = 8.0


def target_rows(steps):
    """[what, figure, target, met] for every target, from one check's step records."""
    groups = {}
    for step in steps:
        groups.setdefault(step["group"], []).append(step)
    rows = [fused_transform(groups.get("minirocket", []))]
    for model, target in STEP_SAMPLES_PER_S.items():
        rows.append(step_rate(model, target, groups.get("profile", []), groups.get("overhead", [])))
    rows += [overhead_ratio(step) for step in groups.get("overhead", []) if step["params"]["batch_size"] == 32]
    return rows + [cold_start(groups.get("cold_start", []), bytecode) for bytecode in COLD_START_ROWS]


def row(what, figure, target, form, at_most=False, note=""):
    bound = f"{'<=' if at_most else '>='} {target:{form}}"
    if figure is None:
        return [what, note or "not measured", bound, "-"]
    met = figure <= target if at_most else figure >= target
    return [what, f"{figure:{form}}" + (f" ({note})" if note else ""), bound, "yes" if met else "no"]


def figures_of(steps):
    return [step.get("figures") or {} for step in steps]


def status_of(steps):
    return ", ".join(step["status"] for step in steps) or "not run"


def fused_transform(steps):
    what = "MiniRocket transform, fused kernel, batch >= 1,024 (windows/s)"
    rates = [(way, rate) for figures in figures_of(steps) for batch, ways in
             (figures.get("windows_per_s") or {}).items() if int(batch) >= 1024 for way, rate in ways.items()]
    fused = max(((rate, way) for way, rate in rates if way in FUSED_WAYS), default=None)
    if fused is None:
        return row(what, None, FUSED_WINDOWS_PER_S, ",.0f", note=f"no fused figure ({status_of(steps)})")
    rate, way = fused
    reference = max((rate for way, rate in rates if way not in FUSED_WAYS), default=None)
    key = "fused_agreement" if way == FUSED else "shared_sums_agreement"
    agreement = next((f[key] for f in figures_of(steps) if f.get(key)), {})
    note = (f"{way}; reference {'not run' if reference is None else format(reference, ',.0f')}; "
            f"{agreement.get('windows_equal_share', float('nan')):.2%} of windows with features equal to the "
            "reference's")
    return row(what, rate, FUSED_WINDOWS_PER_S, ",.0f", note=note)


def step_rate(model, target, matrix_steps, overhead_steps):
    """The best training step of `model` at batch 32: any precision of the matrix (eager or with
    whole-step graphs), and for cnn1d the trainer's side of the overhead benchmark in each mode."""
    candidates = {}
    for figures in figures_of(matrix_steps):
        for entry in figures.get("configurations") or []:
            if entry["model"] == model and entry["batch_size"] == 32 and entry.get("samples_per_s") is not None:
                way = "whole-step graph" if entry.get("graphs") else "eager"
                candidates[f"{way} {entry['precision']}"] = entry["samples_per_s"]
    if model == "cnn1d":
        for step in overhead_steps:
            rate = (step.get("figures") or {}).get("trainer_samples_per_s")
            if step["params"]["batch_size"] == 32 and rate is not None:
                candidates[f"trainer, {step['params']['compile']}"] = rate
    what = f"{model} training step, batch 32 (samples/s)"
    if not candidates:
        return row(what, None, target, ",.0f", note=f"not measured ({status_of(matrix_steps)})")
    best = max(candidates, key=candidates.get)
    return row(what, candidates[best], target, ",.0f", note=f"best: {best}")


def overhead_ratio(step):
    what = f"trainer / minimal loop, batch 32, both {step['params']['compile']}"
    ratio = (step.get("figures") or {}).get("ratio")
    return row(what, ratio, TRAINER_OF_MINIMAL, ".3f", note="" if ratio is not None else step["status"])


# The cold starts that have a target (plan.COLD_STARTS): the machine as found, and as pip leaves it.
COLD_START_ROWS = {
    "as found": "cold `python main.py`, its defaults, first run of the check (s)",
    "written": "the same with Python's bytecode written, as pip installs torch, and Triton's cache empty (s)"}


def cold_start(steps, bytecode):
    what = COLD_START_ROWS[bytecode]
    steps = [step for step in steps if step["params"].get("bytecode", "as found") == bytecode]
    step = next((step for step in steps if step["status"] == "ok"), None)
    if step is None:
        return row(what, None, COLD_START_S, ".1f", at_most=True, note=status_of(steps))
    laps = (step.get("figures") or {}).get("laps") or {}
    note = ", ".join(f"{name} {seconds:.1f}" for name, seconds in laps.items())
    return row(what, step["wall_s"], COLD_START_S, ".1f", at_most=True, note=note)


def target_lines(steps):
    """The targets as the check prints them at its end."""
    return [f"{what}: {figure} (target {target}; met: {met})" for what, figure, target, met in target_rows(steps)]

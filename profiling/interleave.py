"""The one A/B loop of every comparison: sides taken in turn, the order reversed every other round."""
from profiling.timing import HostCpuMeter


def interleave(sides, rounds):
    """Run each side once a round, A B, B A, A B, ...: a side that always ran first would also carry
    any drift within a round. `sides` maps a name to run(round_index) -> result. Yields, round by
    round, ({name: result}, cores other processes kept busy during the round, None where unknown)."""
    for round_index in range(rounds):
        meter = HostCpuMeter()
        order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
        results = {name: sides[name](round_index) for name in order}
        yield results, meter.other_cores()


def per_side(rounds_results):
    """{name: [its result of each round]} from what interleave yielded."""
    rounds_results = list(rounds_results)
    return {name: [results[name] for results, _ in rounds_results] for name in rounds_results[0][0]}

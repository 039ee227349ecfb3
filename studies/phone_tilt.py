"""How differently people's phones sit: the direction of gravity per person and activity, and what
turning one person's windows does to a trained model.

  python -m studies.phone_tilt --data-dir ../hapt-all21
  python -m studies.phone_tilt --data-dir ../hapt-all21 --checkpoint runs/nested/NAME/outer-2/best.pt --person 14

Without --checkpoint: for each activity, how far each person's mean gravity direction (total
acceleration averaged over a window, as a unit vector, then over the person's windows) lies from
the people's mean, and how far apart one person's walking and walking upstairs, and sitting and
standing, lie; per person, where their standing lies and how their tilt changes when they sit.
With --checkpoint: the model's accuracy on --person's windows of its own test split
turned by each of --degrees about --axis (every sensor's x/y/z together), inference only.
Development data only: nothing in the tests needs it.
"""
import statistics
import sys

import numpy as np

from benchmarks import entry_parser
from data.augment import sensor_triples
from data.splits import load_har_data
from inference.bundle import load_bundle, pick_device, probabilities
from inference.evaluate import splits_as_trained
from studies.tta_nested import transformed
from training.errors import UsageError, run_entry_point

PAIRS = (("WALKING", "WALKING_UPSTAIRS"), ("SITTING", "STANDING"))


def person_directions(data, activities):
    """{activity: {person: unit mean gravity direction of their windows of it}}: a window's gravity is its
    total acceleration averaged over time as a unit vector; every split's windows count."""
    splits = [split for split in (data.train, data.val, data.test) if split is not None and len(split.labels)]
    total = [list(data.channel_names).index(f"total_acc_{axis}") for axis in "xyz"]
    gravity = np.concatenate([split.signals[:, total] for split in splits]).mean(axis=2)
    gravity /= np.linalg.norm(gravity, axis=1, keepdims=True)
    labels, people = (np.concatenate([getattr(s, field) for s in splits]) for field in ("labels", "subjects"))
    directions = {}
    for activity in activities:
        of_activity = labels == list(data.class_names).index(activity)
        chosen = {p: of_activity & (people == p) for p in sorted(set(people.tolist()))}
        means = {p: gravity[mine].mean(axis=0) for p, mine in chosen.items() if mine.any()}
        directions[activity] = {p: mean / np.linalg.norm(mean) for p, mean in means.items()}
    return directions


def cosine(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def angle_deg(a, b):
    return float(np.degrees(np.arccos(np.clip(cosine(a, b), -1.0, 1.0))))


def print_spread(data):
    directions = person_directions(data, data.class_names)
    print(f"{len({p for by_person in directions.values() for p in by_person})} people; angle of each person's "
          "mean gravity from the people's mean, degrees")
    for name, by_person in directions.items():
        centre = np.mean(list(by_person.values()), axis=0)
        angles = {p: angle_deg(d, centre) for p, d in by_person.items()}
        farthest = max(angles, key=angles.get)
        print(f"  {name:>20}: median {statistics.median(angles.values()):5.1f}, "
              f"farthest {angles[farthest]:5.1f} (person {farthest})")
    print("angle between one person's two activities, degrees")
    for first, second in PAIRS:
        angles = [angle_deg(d, directions[second][p]) for p, d in directions[first].items() if p in directions[second]]
        print(f"  {first} / {second}: median {statistics.median(angles):.1f}, "
              f"from {min(angles):.1f} to {max(angles):.1f}")


def print_postures(data):
    """Per person: how far their standing lies from the people's standing and sitting, and whether
    their tilt changes from standing to sitting the way most people's does."""
    sits, stands = person_directions(data, ("SITTING", "STANDING")).values()
    persons = [p for p in sits if p in stands]
    sit_centre = np.mean([sits[p] for p in persons], axis=0)
    stand_centre = np.mean([stands[p] for p in persons], axis=0)
    usual_change = np.mean([sits[p] - stands[p] for p in persons], axis=0)
    print("standing against the people's postures, degrees; cosine of the person's change from standing "
          "to sitting with the people's mean change")
    for p in persons:
        print(f"  person {p:>3}: to standing {angle_deg(stands[p], stand_centre):5.1f}, "
              f"to sitting {angle_deg(stands[p], sit_centre):5.1f}, "
              f"change cosine {cosine(sits[p] - stands[p], usual_change):5.2f}")


def print_turned(checkpoint, person, axis, degrees, device):
    bundle = load_bundle(checkpoint)
    data = splits_as_trained(bundle.config, bundle.config.data.dataset, bundle.config.data.data_dir)
    chosen = data.test.subjects == person
    if not chosen.any():
        raise UsageError(f"person {person} is not in {checkpoint}'s test split; name one of its test people")
    windows, labels = data.test.signals[chosen], data.test.labels[chosen]
    triples = sensor_triples(data.channel_names)
    print(f"person {person}, {len(labels)} windows, turned about {'xyz'[axis]}:")
    for angle in degrees:
        predicted = probabilities(bundle, transformed(windows, "rotate", (axis, angle), triples), device).argmax(1)
        print(f"  {angle:+6.1f} degrees: accuracy {np.mean(predicted == labels):.3f}")


def main(argv=None):
    parser = entry_parser("studies.phone_tilt", __doc__)
    parser.add_argument("--data-dir", help="UCI HAR layout (or an .npz with --dataset npz): every person in it")
    parser.add_argument("--dataset", default="auto")
    parser.add_argument("--checkpoint", help="a trained model; its own test split is used")
    parser.add_argument("--person", type=int, help="with --checkpoint: the person whose windows are turned")
    parser.add_argument("--axis", type=int, default=1, choices=(0, 1, 2), help="0 x, 1 y, 2 z")
    parser.add_argument("--degrees", default="-15,0,15")
    parser.add_argument("--device", default="auto")
    opts = parser.parse_args(argv)
    if opts.checkpoint:
        if opts.person is None:
            parser.exit(2, "error: --checkpoint needs --person, the person whose windows to turn\n")
        degrees = [float(part) for part in opts.degrees.split(",")]
        print_turned(opts.checkpoint, opts.person, opts.axis, degrees, pick_device(opts.device))
    elif opts.data_dir:
        data = load_har_data(opts.dataset, opts.data_dir)
        print_spread(data)
        print_postures(data)
    else:
        parser.exit(2, "error: give --data-dir (the spread of tilts) or --checkpoint and --person\n")
    return 0


if __name__ == "__main__":
    sys.exit(run_entry_point(main))

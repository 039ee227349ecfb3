"""A deterministic, vectorised generator of UCI-HAR-shaped windows, so every run works offline.

The physics is deliberately simple but carries the cues real models use: gravity in total_acc
whose direction gives the posture, periodic gait with class-specific cadence, harmonics and
heel-strike impacts for the three walking classes, and per-subject cadence, amplitude, device
tilt and noise. Sitting and standing differ only by a few degrees of trunk pitch, which overlaps
with the spread between subjects, so those two classes are hard on purpose.
"""
import numpy as np

from data.uci_har import SAMPLE_RATE_HZ, WINDOW_STEPS

NUM_SUBJECTS = 30
# The volunteers UCI HAR puts in its test split; the other 21 are the training subjects.
TEST_SUBJECTS = (2, 4, 9, 10, 12, 13, 18, 20, 24)
# Class shares of UCI HAR (walking, upstairs, downstairs, sitting, standing, laying).
CLASS_SHARE = np.array([0.167, 0.150, 0.137, 0.175, 0.185, 0.186])
DEFAULT_WINDOWS_PER_SUBJECT = 343  # 30 x 343 = 10,290 windows, the size of UCI HAR

# Per-class gait parameters, indexed by label; zero for the three static postures.
CADENCE_FACTOR = np.array([1.00, 0.90, 1.08, 1, 1, 1])
VERTICAL_G = np.array([0.30, 0.27, 0.33, 0, 0, 0])
SECOND_HARMONIC = np.array([0.35, 0.22, 0.45, 0, 0, 0])
IMPACT_G = np.array([0.05, 0.05, 0.20, 0, 0, 0])
FORWARD_G = np.array([0.16, 0.12, 0.14, 0, 0, 0])
LATERAL_G = np.array([0.07, 0.05, 0.09, 0, 0, 0])
GYRO_PITCH_RAD_S = np.array([0.25, 0.38, 0.30, 0, 0, 0])
GYRO_ROLL_RAD_S = np.array([0.20, 0.14, 0.26, 0, 0, 0])
GYRO_YAW_RAD_S = np.array([0.15, 0.10, 0.20, 0, 0, 0])
LEAN_DEG = np.array([0.0, 4.0, -2.0, 0, 0, 0])  # trunk pitch while walking
WALKING, UPSTAIRS, DOWNSTAIRS, SITTING, STANDING, LAYING = range(6)


def generate(seed=0, windows_per_subject=DEFAULT_WINDOWS_PER_SUBJECT):
    """Return {"train": (signals, labels, subjects), "test": (...)}; same arguments, same arrays.

    signals are float32 [N, 9, 128] in the UCI channel order, labels int64 in 0..5, subjects
    int64 in 1..30, split by subject exactly as UCI HAR splits its volunteers.
    """
    rng = np.random.default_rng(seed)
    traits = _subject_traits(rng)
    subjects = np.repeat(np.arange(1, NUM_SUBJECTS + 1), windows_per_subject)
    labels = rng.choice(len(CLASS_SHARE), size=subjects.size, p=CLASS_SHARE / CLASS_SHARE.sum())
    signals = _render(rng, labels, subjects - 1, traits)
    is_test = np.isin(subjects, TEST_SUBJECTS)
    return {
        "train": (signals[~is_test], labels[~is_test], subjects[~is_test]),
        "test": (signals[is_test], labels[is_test], subjects[is_test]),
    }


def _subject_traits(rng):
    n = NUM_SUBJECTS
    return {
        "cadence_hz": rng.uniform(1.6, 2.1, n),
        "amplitude": rng.uniform(0.75, 1.3, n),
        "device_tilt_deg": rng.normal(0.0, 6.0, (n, 3)),
        "stand_pitch_deg": rng.normal(0.0, 4.0, n),
        "sit_extra_pitch_deg": rng.uniform(6.0, 16.0, n),
        "acc_noise_g": rng.uniform(0.02, 0.05, n),
        "gyro_noise_rad_s": rng.uniform(0.02, 0.05, n),
    }


def _render(rng, labels, subject_index, traits):
    n = labels.size
    t = (np.arange(WINDOW_STEPS) / SAMPLE_RATE_HZ).astype(np.float32)
    amplitude = traits["amplitude"][subject_index] * rng.uniform(0.85, 1.15, n)
    cadence = traits["cadence_hz"][subject_index] * CADENCE_FACTOR[labels] * rng.uniform(0.94, 1.06, n)
    # Gait angle: one cycle per step, starting anywhere in the cycle.
    angle = (2 * np.pi * cadence).astype(np.float32)[:, None] * t \
        + rng.uniform(0, 2 * np.pi, (n, 1)).astype(np.float32)

    def per_class(table):
        # Each window varies its gait around the class's typical value, so classes overlap.
        return (table[labels] * amplitude * rng.uniform(0.75, 1.25, n))[:, None].astype(np.float32)

    # Heel strike: a sharp pulse at the start of every step, decaying within ~0.1 of a cycle.
    impact = np.exp(-np.mod(angle, 2 * np.pi) / 0.35)
    # The draws keep their order (the data of a --synthetic-seed never changes): vertical gain, second
    # harmonic, impact gain, impact spread.
    vertical_gain = per_class(VERTICAL_G)
    second_harmonic = (SECOND_HARMONIC[labels] + rng.uniform(-0.1, 0.1, n))[:, None].astype(np.float32)
    vertical = (vertical_gain * (np.sin(angle) + second_harmonic * np.sin(2 * angle + 0.6))
                + per_class(IMPACT_G) * rng.uniform(0.5, 1.5, (n, 1)) * impact)
    forward = per_class(FORWARD_G) * np.cos(angle)
    lateral = per_class(LATERAL_G) * np.sin(angle / 2)  # sway repeats once per stride
    # Standing still is never perfectly still: a slow balance sway, larger when standing.
    sway_g = np.where(labels == STANDING, 0.006, np.where(labels == SITTING, 0.003, 0.0))
    vertical = vertical + sway_g[:, None] * np.sin(2 * np.pi * 0.3 * t + angle[:, :1])
    body_acc = np.stack([vertical, lateral, forward], axis=1)

    gyro = np.stack([
        per_class(GYRO_YAW_RAD_S) * np.sin(angle / 2 + 0.3),
        per_class(GYRO_PITCH_RAD_S) * np.sin(angle + 1.0),
        per_class(GYRO_ROLL_RAD_S) * np.sin(angle / 2 + 1.2),
    ], axis=1)

    gravity = _gravity_direction(rng, labels, subject_index, traits)[:, :, None]
    mounting = _rotation_matrices(np.radians(traits["device_tilt_deg"]))[subject_index]
    body_acc = mounting @ body_acc
    total_acc = body_acc + mounting @ gravity  # gravity is constant over the window
    gyro = mounting @ gyro

    acc_noise = traits["acc_noise_g"][subject_index][:, None, None]
    gyro_noise = traits["gyro_noise_rad_s"][subject_index][:, None, None]
    body_acc = body_acc + rng.standard_normal(body_acc.shape, dtype=np.float32) * acc_noise
    total_acc = total_acc + rng.standard_normal(total_acc.shape, dtype=np.float32) * acc_noise
    gyro = gyro + rng.standard_normal(gyro.shape, dtype=np.float32) * gyro_noise
    return np.concatenate([body_acc, gyro, total_acc], axis=1).astype(np.float32)


def _gravity_direction(rng, labels, subject_index, traits):
    """Unit gravity in the body frame (x up the trunk); pitch and roll set by the posture."""
    n = labels.size
    pitch = traits["stand_pitch_deg"][subject_index] + LEAN_DEG[labels]
    pitch = pitch + np.where(labels == SITTING, traits["sit_extra_pitch_deg"][subject_index], 0.0)
    pitch = np.where(labels == LAYING, rng.normal(85.0, 5.0, n), pitch) + rng.normal(0, 2.5, n)
    roll = np.where(labels == LAYING, rng.normal(0.0, 25.0, n), rng.normal(0.0, 2.0, n))
    pitch, roll = np.radians(pitch), np.radians(roll)
    return np.stack([np.cos(pitch), np.sin(pitch) * np.sin(roll), np.sin(pitch) * np.cos(roll)], axis=1)


def _rotation_matrices(angles_rad):
    """Rotation matrices [n, 3, 3] from per-row (about x, about y, about z) angles."""
    a, b, c = angles_rad[:, 0], angles_rad[:, 1], angles_rad[:, 2]
    one, zero = np.ones_like(a), np.zeros_like(a)
    about_x = np.stack([one, zero, zero, zero, np.cos(a), -np.sin(a), zero, np.sin(a), np.cos(a)], 1)
    about_y = np.stack([np.cos(b), zero, np.sin(b), zero, one, zero, -np.sin(b), zero, np.cos(b)], 1)
    about_z = np.stack([np.cos(c), -np.sin(c), zero, np.sin(c), np.cos(c), zero, zero, zero, one], 1)
    return about_z.reshape(-1, 3, 3) @ about_y.reshape(-1, 3, 3) @ about_x.reshape(-1, 3, 3)

"""The state/action rule: which features a frame's state and action come from."""

from __future__ import annotations

import pytest

from episode_pipeline.lerobot.features import (
    features_from_info,
    is_numeric_dtype,
    resolve_frame_features,
)
from episode_pipeline.lerobot.info import parse_info

VECTOR = {"dtype": "float32", "shape": [6], "names": None}
CAMERA = {"dtype": "video", "shape": [240, 320, 3], "names": ["height", "width", "channels"]}


def resolve(*numeric: str, other: tuple[str, ...] = ()):
    names = {name: True for name in numeric} | {name: False for name in other}
    return resolve_frame_features(names, source="meta/info.json")


@pytest.mark.parametrize(
    ("names", "state"),
    [
        (("observation.state", "state", "observation.joint_state"), "observation.state"),
        (("state", "observation.joint_state"), "state"),
        (("observation.joint_state", "observation.velocity"), "observation.joint_state"),
        (("observation.robot_STATE",), "observation.robot_STATE"),
    ],
)
def test_state_rule_in_order(names, state):
    assert resolve(*names).state == state
    assert resolve(*names).missing_state is None


def test_exact_names_win_whatever_their_type():
    assert resolve(other=("observation.state",)).state == "observation.state"


def test_pattern_needs_a_numeric_observation_feature():
    # A camera called ...state..., or a top-level feature with "state" in it, is not a state.
    features = resolve("robot_state", "next.state_done", other=("observation.images.state_cam",))
    assert features.state is None
    assert features.missing_state == (
        "meta/info.json: no state feature "
        "(observation.state, else state, else a single observation.*state* vector)"
    )


def test_several_pattern_matches_are_ambiguous_and_listed():
    features = resolve("observation.state_arm", "observation.gripper_state")
    assert features.state is None
    assert features.state_candidates == ("observation.gripper_state", "observation.state_arm")
    assert "several candidates: observation.gripper_state, observation.state_arm" in (
        features.missing_state
    )


@pytest.mark.parametrize(
    ("names", "action"),
    [(("action", "actions"), "action"), (("actions",), "actions"), (("act",), None)],
)
def test_action_rule(names, action):
    assert resolve(*names).action == action


@pytest.mark.parametrize(
    ("dtype", "numeric"),
    [("float32", True), ("float64", True), ("int64", True), ("uint8", True), ("video", False),
     ("image", False), ("string", False), ("bool", False), (None, False), (3, False)],
)  # fmt: skip
def test_numeric_dtypes(dtype, numeric):
    assert is_numeric_dtype(dtype) is numeric


@pytest.mark.parametrize(
    "names",
    [
        ["j1", "j2", "j3", "j4", "j5", "j6"],  # flat list (LeRobot v2.1+)
        [["j1", "j2", "j3"], ["j4", "j5", "j6"]],  # nested list
        {"motors": ["j1", "j2", "j3", "j4", "j5", "j6"]},  # dict (LeRobot v2.0)
        None,
        "joints",
    ],
    ids=["flat", "nested", "dict", "null", "string"],
)
def test_any_names_shape_resolves_from_info_json(names):
    info = parse_info(
        {
            "fps": 30,
            "features": {
                "observation.joint_state": {**VECTOR, "names": names},
                "actions": {**VECTOR, "names": names},
                "observation.images.front": CAMERA,
            },
        },
        source="ds/meta/info.json",
    )
    features = features_from_info(info)
    assert features is not None
    assert (features.state, features.action, features.source) == (
        "observation.joint_state",
        "actions",
        "ds/meta/info.json",
    )
    assert info.camera_keys == ("observation.images.front",)


def test_info_json_without_features_leaves_it_to_the_data_files():
    assert features_from_info(parse_info({"fps": 30})) is None

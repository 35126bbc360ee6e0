"""A damaged Minari dataset is refused with one error naming the damaged file, wherever the
read fails (loading, the episodes' metadata, an episode decoded while filling), from the
library and from ``rlstash train --dataset`` (one line, exit 2, no run directory). One
mechanism (:func:`rlstash.datasets.minari.reading`), one case per kind of damage."""

from __future__ import annotations

import json
import os
import shutil

import gymnasium as gym
import numpy as np
import pytest

from rlstash import ReplayBuffer
from rlstash.cli.main import main
from rlstash.finite import NonFiniteError
from rlstash.manifest import DamagedFile
from tests.offline.conftest import collect

pytest.importorskip("minari", reason="Minari tests need rlstash[minari]")
h5py = pytest.importorskip("h5py", reason="Minari's HDF5 datasets need h5py")


def _metadata_not_json(data):
    (data / "metadata.json").write_text("{not json")
    return data / "metadata.json"


def _metadata_names_another_id(data):
    meta = json.loads((data / "metadata.json").read_text())
    meta["dataset_id"] = "test/other-v0"
    (data / "metadata.json").write_text(json.dumps(meta))
    return data / "metadata.json"


def _data_file_missing(data):
    (data / "main_data.hdf5").unlink()
    return data


def _data_file_truncated(data):
    f = data / "main_data.hdf5"
    os.truncate(f, f.stat().st_size // 2)
    return f


def _data_file_overwritten(data):
    f = data / "main_data.hdf5"
    with open(f, "r+b") as out:
        out.write(b"\0" * 4096)
    return f


def _episode_field_missing(data):
    f = data / "main_data.hdf5"
    with h5py.File(f, "a") as h:
        del h["episode_1"]["observations"]
    return f


DAMAGE = [_metadata_not_json, _metadata_names_another_id, _data_file_missing,
          _data_file_truncated, _data_file_overwritten, _episode_field_missing]  # fmt: skip


def _damaged(minari_path, damage):
    collect("test/pend-v0", gym.make("Pendulum-v1", max_episode_steps=40), steps=200)
    src = minari_path / "test" / "pend-v0"
    shutil.copytree(src, minari_path / "test" / "bad-v0")
    data = minari_path / "test" / "bad-v0" / "data"
    meta = json.loads((data / "metadata.json").read_text())
    meta["dataset_id"] = "test/bad-v0"
    (data / "metadata.json").write_text(json.dumps(meta))
    return damage(data)


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__[1:])
def test_a_damaged_dataset_is_refused_naming_its_file(minari_path, damage):
    file = _damaged(minari_path, damage)
    with pytest.raises(DamagedFile) as err:
        ReplayBuffer.from_minari("test/bad-v0")
    assert err.value.file == file
    assert str(file) in str(err.value) and "recreate the dataset" in str(err.value)
    assert len(ReplayBuffer.from_minari("test/pend-v0")) > 0  # its intact twin still loads


@pytest.mark.parametrize("damage", [_metadata_not_json, _episode_field_missing],
                         ids=["on load", "while filling"])  # fmt: skip
def test_train_on_a_damaged_dataset_is_one_line_exit_2(tmp_path, minari_path, capsys, damage):
    file = _damaged(minari_path, damage)
    code = main(["train", "--quiet", "--device", "cpu", "--run-dir", str(tmp_path / "runs"),
                 "--algo", "iql", "--dataset", "test/bad-v0", "--steps", "10"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{file} is damaged" in err, err
    assert not (tmp_path / "runs").exists()


def test_an_episode_shorter_than_its_fields_names_the_dataset(minari_path):
    _damaged(minari_path, lambda data: None)
    with h5py.File(minari_path / "test" / "bad-v0" / "data" / "main_data.hdf5", "a") as h:
        obs = np.asarray(h["episode_1"]["observations"])[:-5]
        del h["episode_1"]["observations"]
        h["episode_1"]["observations"] = obs
    with pytest.raises(ValueError, match=r"dataset test/bad-v0 \(.*main_data\.hdf5\): episode 1"):
        ReplayBuffer.from_minari("test/bad-v0")


def test_a_non_finite_value_names_the_dataset_episode_and_field(minari_path):
    _damaged(minari_path, lambda data: None)
    with h5py.File(minari_path / "test" / "bad-v0" / "data" / "main_data.hdf5", "a") as h:
        obs = np.asarray(h["episode_2"]["observations"])
        obs[3, 1] = np.nan
        h["episode_2"]["observations"][...] = obs
    with pytest.raises(NonFiniteError, match=r"dataset test/bad-v0 \(.*main_data\.hdf5\): "
                       r"episode 2's observations holds a non-finite value"):  # fmt: skip
        ReplayBuffer.from_minari("test/bad-v0")
    assert len(ReplayBuffer.from_minari("test/bad-v0", check_finite=False)) > 0


def test_every_flip_of_the_data_file_loads_or_is_the_file_named(minari_path):
    """64 bytes flipped at every 97th offset of the HDF5 file (it has no checksums, so many
    flips load): each load fills a buffer or is a DamagedFile naming the file, whatever h5py
    raised (its RuntimeError of a damaged heap included), never another exception."""
    file = _damaged(minari_path, lambda data: data / "main_data.hdf5")
    data = file.read_bytes()
    refused = 0
    for at in range(0, len(data) - 64, 97):
        flipped = bytearray(data)
        flipped[at : at + 64] = bytes(b ^ 0xFF for b in flipped[at : at + 64])
        file.write_bytes(bytes(flipped))
        try:
            ReplayBuffer.from_minari("test/bad-v0")
        except DamagedFile as exc:
            assert exc.file == file and "recreate the dataset" in str(exc), exc
            refused += 1
        except NonFiniteError:  # flipped floats: refused where they enter (I10)
            pass
    assert refused > 0

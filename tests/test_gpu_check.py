"""A Slurm job granted GPUs that its torch cannot use (a driver older than the torch build's CUDA,
a CPU-only torch) fails at once in every GPU stage instead of computing on the CPU until its time
limit (retrieval_pretraining.gpu_check). No GPU or Slurm here: the job's environment, the driver's
device file and torch's CUDA answer are faked."""

import warnings

import pytest
import torch

from retrieval_pretraining import encode, gpu_check, training

pytestmark = pytest.mark.filterwarnings("ignore:CUDA initialization")
SLURM_GPU_JOB = {"SLURM_JOB_ID": "4242", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


@pytest.fixture
def no_usable_cuda(monkeypatch, tmp_path):
    """A node with the NVIDIA driver loaded whose torch (a CUDA 13 build) finds no GPU, warning
    as torch does when the driver is too old."""
    driver = tmp_path / "nvidiactl"
    driver.touch()
    monkeypatch.setattr(gpu_check, "DRIVER_DEVICE", driver)
    monkeypatch.setattr(torch.version, "cuda", "13.0")

    def is_available():
        warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old "
                      "(found version 12040).", UserWarning)
        return False

    monkeypatch.setattr(torch.cuda, "is_available", is_available)
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    return driver


def _slurm_gpu_job(monkeypatch):
    for key, value in SLURM_GPU_JOB.items():
        monkeypatch.setenv(key, value)


def test_a_trainer_granted_gpus_it_cannot_use_fails_naming_the_driver(no_usable_cuda,
                                                                      monkeypatch):
    _slurm_gpu_job(monkeypatch)
    with pytest.raises(gpu_check.GPUUnusableError) as error:
        training.init_distributed()
    message = str(error.value)
    assert "Slurm job 4242 was granted 8 GPU(s)" in message
    assert "CUDA 13.0" in message and "driver on your system is too old" in message
    assert "envs/torch.yaml" in message


def test_an_encoder_granted_a_gpu_it_cannot_use_fails(no_usable_cuda, monkeypatch):
    """Corpus encoding, mining and dense search pick their device here (load_encoder)."""
    _slurm_gpu_job(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(gpu_check.GPUUnusableError, match="granted 1 GPU"):
        encode.device()


def test_a_cpu_only_torch_is_named(no_usable_cuda, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(gpu_check.GPUUnusableError, match="is a CPU-only build"):
        gpu_check.refuse_unusable_gpus(SLURM_GPU_JOB)


@pytest.mark.parametrize("env, driver", [
    ({"CUDA_VISIBLE_DEVICES": "0,1"}, True),  # no Slurm job: a laptop or CI keeps the CPU
    ({"SLURM_JOB_ID": "1"}, True),  # a job granted no GPU
    ({"SLURM_JOB_ID": "1", "CUDA_VISIBLE_DEVICES": "NoDevFiles"}, True),
    ({"SLURM_JOB_ID": "1", "CUDA_VISIBLE_DEVICES": ""}, True),
    (SLURM_GPU_JOB, False),  # fake GPUs on a node without the driver (tests/test_slurm.py)
])
def test_the_cpu_stays_allowed_where_no_usable_gpu_was_granted(env, driver, no_usable_cuda,
                                                               monkeypatch):
    if not driver:
        no_usable_cuda.unlink()
    gpu_check.refuse_unusable_gpus(env)
    for key in ("SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert encode.device() == torch.device("cpu")
    assert training.init_distributed().device == torch.device("cpu")


def test_a_usable_gpu_is_used(monkeypatch, tmp_path):
    """With torch seeing the granted GPU nothing is refused (the check runs only on the way to the
    CPU)."""
    driver = tmp_path / "nvidiactl"
    driver.touch()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu_check.refuse_unusable_gpus(SLURM_GPU_JOB, driver)
    assert encode.device() == torch.device("cuda")

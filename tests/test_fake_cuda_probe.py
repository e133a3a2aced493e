import copy
import pytest
import torch
import pretrain_fixtures as fx
from pretrain_fixtures import restore_stop_handlers  # noqa: F401
from test_pretrain_train import _run, _wrap_forward, setup  # noqa: F401
from retrieval_pretraining import training
from retrieval_pretraining.pretrain.model import Pretrainer


@pytest.mark.parametrize("objective", ["mlm", "costa", "cpdae", "cpdae_r", "bow", "condenser",
                                       "cocondenser", "retromae", "ae_decoder", "ar_decoder"])
@pytest.mark.parametrize("unpad", [False, True])
def test_fake(objective, unpad, setup, tmp_path, monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode
    got = []
    _wrap_forward(monkeypatch, before=lambda m, b: got or got.append((copy.deepcopy(m), dict(b))))
    assert _run(fx.model_settings(objective, max_steps=1, unpad=unpad), setup, tmp_path)[0] == 0
    model, batch = got[0]
    device = torch.device("cuda")
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        for module in model.modules():
            for name, p in list(module._parameters.items()):
                if p is not None:
                    module._parameters[name] = torch.nn.Parameter(torch.empty_like(mode.from_tensor(p.detach()), device=device), requires_grad=p.requires_grad)
            for name, b in list(module._buffers.items()):
                if b is not None:
                    module._buffers[name] = torch.empty_like(mode.from_tensor(b), device=device)
        batch = {k: torch.empty_like(mode.from_tensor(v), device=device) for k, v in batch.items()}
        progress = torch.full((), 0.5, dtype=torch.float64, device=device)
        with training.autocast(device):
            out = Pretrainer.forward(model, batch, progress)
        out["loss"].backward()
        assert {v.device.type for v in out.values()} == {"cuda"}

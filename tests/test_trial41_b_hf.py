"""Fresh-user trial fix: a Hugging Face model's forward prints no transformers ``FutureWarning``
(``create_causal_mask`` is called with ``cache``, not the deprecated ``past_key_values``)."""

from __future__ import annotations

import warnings

import pytest
import torch

from hpp.runtime.models.hf import hf_model
from hpp.runtime.models.stage import build_stage

pytest.importorskip("transformers")


@pytest.mark.parametrize("name", ["opt-tiny", "gpt-neo-tiny", "llama-tiny"])
def test_tiny_hf_model_forward_warns_nothing_future(name):
    model = hf_model(name)
    stage = build_stage(model, 0, model.spec.num_layers, seed=0, dtype=torch.float32)
    tokens = torch.randint(0, model.spec.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        out = stage(tokens)
    assert out.shape == (2, 8, model.spec.vocab_size) and bool(torch.isfinite(out).all())


def test_the_deprecated_keyword_is_what_warned():
    import inspect

    from hpp.runtime.models import hf_layers
    from transformers.masking_utils import create_causal_mask

    if "cache" not in inspect.signature(create_causal_mask).parameters:
        pytest.skip("a transformers without create_causal_mask(cache=...): past_key_values is not deprecated there")
    assert hf_layers._CACHE_KWARG == "cache"
    cfg = hf_model("gpt-neo-tiny").config                                    # eager: a real mask is built
    x = torch.zeros(1, 4, cfg.hidden_size)
    pos = torch.arange(4).unsqueeze(0)
    with warnings.catch_warnings():                                          # control: the old call warns
        warnings.simplefilter("error", FutureWarning)
        with pytest.raises(FutureWarning, match="past_key_values"):
            create_causal_mask(config=cfg, inputs_embeds=x, attention_mask=None, past_key_values=None,
                               position_ids=pos)
        mask = hf_layers._causal_mask(cfg, x, pos)
    assert mask.shape == (1, 1, 4, 4) and mask[0, 0, 0, 1] < -1e30 and mask[0, 0, 1, 0] == 0

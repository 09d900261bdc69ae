"""A tied copy on another stage starts from the first name's draw, whatever the model drew for it (trial defect)."""

from __future__ import annotations

import torch

from examples.user_model import UserGPT
from hpp.runtime.models.stage import build_stage


class TiedUserGPT(UserGPT):
    """The README's example with its head projection tied to the token table (the head draws its own value)."""

    def tied_parameters(self):
        return (("layers.0.tok.weight", f"layers.{self.spec.num_layers - 1}.out.weight"),)


def test_head_only_stage_gets_the_embedding_draw_of_its_tied_copy():
    model = TiedUserGPT()
    L = model.spec.num_layers
    whole = build_stage(model, 0, L, seed=3, dtype=torch.float64)
    emb = dict((n, p) for _l, n, p in whole.layer_parameters())["layers.0.tok.weight"]
    head = build_stage(model, L - 1, L, seed=3, dtype=torch.float64)
    copy = dict((n, p) for _l, n, p in head.layer_parameters())[f"layers.{L - 1}.out.weight"]
    assert torch.equal(copy, emb)
    # control: the model's own head draw differs (so without the rule the copies would start apart)
    own = model.build_layer(L - 1, seed=3, dtype=torch.float64).out.weight
    assert not torch.equal(own, emb)

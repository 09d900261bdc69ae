"""Your own model for hpp: a small GPT from torch.nn modules (README "Your own model").

hpp profile --model examples.user_model:build ... ; hpp run PLAN --model examples.user_model:build
"""
import torch
import torch.nn.functional as F
from torch import nn

from hpp.runtime.models.api import ModelSpec, layer_generator


class Embed(nn.Module):                      # layer 0: tokens (b, s) -> (b, s, h)
    def __init__(self, c):
        super().__init__()
        self.tok, self.pos = nn.Embedding(c.vocab_size, c.hidden_size), nn.Embedding(c.seq_len, c.hidden_size)

    def forward(self, t):
        return self.tok(t) + self.pos(torch.arange(t.shape[1], device=t.device))


class Block(nn.Module):                      # layers 1 .. L-2: (b, s, h) -> (b, s, h)
    def __init__(self, c):
        super().__init__()
        h, self.head_dim = c.hidden_size, c.hidden_size // c.num_heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))
        self.up, self.down = nn.Linear(h, c.ffn_size), nn.Linear(c.ffn_size, h)

    def forward(self, x):
        b, s, _ = x.shape
        y = self.ln1(x)                      # view(..., -1, head_dim): the heads this TP rank holds
        q, k, v = (m(y).view(b, s, -1, self.head_dim).transpose(1, 2) for m in (self.q, self.k, self.v))
        x = x + self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Head(nn.Module):                       # layer L-1: (b, s, h) -> logits (b, s, V)
    def __init__(self, c):
        super().__init__()
        self.ln, self.out = nn.LayerNorm(c.hidden_size), nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, x):
        return self.out(self.ln(x))


class UserGPT:
    spec = ModelSpec(name="user-gpt", num_layers=5, seq_len=32, vocab_size=256, hidden_size=64,
                     num_heads=4, num_kv_heads=4, ffn_size=256)

    def build_layer(self, index, *, seed, dtype):
        layer = (Embed if index == 0 else Head if index == self.spec.num_layers - 1 else Block)(self.spec).to(dtype)
        gen = layer_generator(seed, index)   # weights from (seed, index) alone: every rank builds the same layer
        with torch.no_grad():
            for name, p in layer.named_parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02 if p.dim() > 1 else
                        torch.zeros_like(p) if name.endswith("bias") else torch.ones_like(p))
        return layer

    def tp_plan(self, index, tp_degree):     # module paths inside layer `index` -> sharding style
        if tp_degree == 1 or index in (0, self.spec.num_layers - 1):
            return {}
        return {"q": "colwise", "k": "colwise", "v": "colwise", "o": "rowwise", "up": "colwise", "down": "rowwise"}

    def tied_parameters(self):
        return ()


def build():
    return UserGPT()

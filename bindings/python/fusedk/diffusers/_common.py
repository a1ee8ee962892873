"""What the model files (flux.py, ...) share: checks of diffusers' modules that every model has
(attention, feed-forward, position embedding), the gate to the stock forward while autograd
records, and per-forward caches."""
import warnings

import torch

from ._block_op import compiling

_warned = set()


def records_grad(m, *inputs):
    """Whether autograd would record block m's forward on these arguments (tensors among them; the
    fused forward then gives way to the stock one, with a warning once per block class)."""
    if not torch.is_grad_enabled():
        return False
    if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs) and not any(
            p.requires_grad for p in m.parameters()):
        return False
    cls = type(m).__name__
    if cls not in _warned:
        _warned.add(cls)
        warnings.warn(f"fusedk.diffusers: {cls} runs its stock forward while autograd records (fusedk's fused "
                      "forwards have no backward); use torch.no_grad() or torch.inference_mode() for inference",
                      RuntimeWarning, stacklevel=3)
    return True


def warn_once(text):
    """A warning once a process (every block of a class says the same)."""
    if text not in _warned:
        _warned.add(text)
        warnings.warn(text, RuntimeWarning, stacklevel=3)


def attention_why_not(attn, processor):
    """The checks every model's attention takes: exactly its stock processor (IP-adapter and custom
    processors compute otherwise), no context parallelism, projections not fused by diffusers, no
    output dropout: a reason, or None."""
    p = attn.processor
    if type(p) is not processor:
        return f"attention processor {type(p).__name__}, expected {processor.__name__}"
    if getattr(p, "_parallel_config", None) is not None:
        return "context-parallel attention"
    if getattr(attn, "fused_projections", False):
        return "diffusers' fuse_qkv_projections() is on (unfuse_qkv_projections() first)"
    out = getattr(attn, "to_out", None)
    if out is not None and len(out) > 1 and (type(out[1]) is not torch.nn.Dropout or out[1].p != 0):
        return "attention output dropout p > 0"
    return None


def eps_of(norm, dtype):
    """A norm module's eps (None: torch's default, the dtype's machine epsilon)."""
    return norm.eps if norm.eps is not None else torch.finfo(dtype).eps


def gelu_ff_why_not(ff):
    """Why diffusers' FeedForward ff is not Linear + GELU(tanh) + Linear (what linear's epilogue
    and a second linear run): a reason, or None."""
    from diffusers.models.activations import GELU
    net = list(ff.net)
    if len(net) != 3 or type(net[0]) is not GELU or net[0].approximate != "tanh":
        return "feed-forward is not Linear + GELU(tanh) + Linear"
    if type(net[1]) is not torch.nn.Dropout or net[1].p != 0:
        return "feed-forward dropout p > 0"
    return None


def rows(t):
    """t as linear takes it: rows evenly spaced (a slice of a joint sequence is, for B = 1)."""
    return t if t.shape[0] == 1 or t.is_contiguous() else t.contiguous()


class PerForward:
    """What a patched forward derives from an object every block of one model forward gets (the
    rope tables' tuple): made by the first block, kept with that object (and `extra`) until
    another comes, so once a forward. Eager only: under torch.compile each trace makes its own, and
    block_op's blocks (new tuples) make theirs each: keyed by the tensors instead, it could serve
    stale tables, as CUDA-graph trees hand back the same tensor objects, refilled, each replay."""

    every = []

    def __init__(self):
        self.entry = (None, None, None)  # (object, extra, value): one tuple, read and set at once
        PerForward.every.append(self)

    def get(self, obj, extra, make):
        if compiling():
            return make()
        key, ex, value = self.entry
        if key is not obj or ex != extra:
            value = make()
            self.entry = (obj, extra, value)
        return value


def embedding_why_not(root, attr, cls, tables):
    """Why root's position embedding (root.<attr>) is not `cls`, whose tables the fused forward
    converts (described by `tables`): a reason, or None (no model root: a block patched alone)."""
    pe = getattr(root, attr, None)
    if pe is not None and type(pe) is not cls:
        return f"position embedding {type(pe).__name__}, expected {cls.__name__} ({tables})"
    return None

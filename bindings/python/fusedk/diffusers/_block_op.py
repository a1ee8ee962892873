"""A patched block as one operator under torch.compile, fusedk_diffusers::block: the graph calls
the fused forward once a block, as eager code does, instead of each fusedk call through its own
custom operator (each a dispatch into Python, and Inductor's copies around out= writes into views
of the block's buffers). The operator runs eagerly, so it checks what a trace cannot (adapters
swapped in place, new weights, hooks) each time it runs."""
import weakref

import torch

_BLOCKS = {}  # id of a patched block -> a weak reference to it
_KINDS = []  # the patchers with an operator form: their index is the operator's `kind`
_BLOCK_OP = []


def compiling():
    """Whether torch.compile traces this call (no host syncs, no data pointers)."""
    return torch.compiler.is_compiling()


def exporting():
    """Whether torch.export (non-strict, its default) runs this call: is_exporting() alone is true
    under torch.compile's tracing too."""
    return torch.compiler.is_exporting() and not torch.compiler.is_dynamo_compiling()


def new_handle(m):
    """Block m's handle for block_op (its id in a CPU tensor), m registered under it."""
    _BLOCKS[id(m)] = weakref.ref(m)
    with torch.inference_mode(False):
        return torch.tensor(id(m))


def register(patcher):
    """Patcher `patcher` as a kind of block the operator runs; the operator defined before any
    trace meets it."""
    if patcher not in _KINDS:
        _KINDS.append(patcher)
    _block_op()


def block_op(st, xs):
    """The patched block of State st run as one operator on tensors xs: its patcher's run_op(block,
    xs) -> [tensors], its fake outputs shapes(xs) -> [empty tensors]. The block is named by a CPU
    tensor holding its id (an int would be a constant of the graph: a recompile a block)."""
    return _BLOCK_OP[0](_KINDS.index(st.patcher), st.handle, xs)


def _block_op():
    if not _BLOCK_OP:
        # cudagraph_unsafe: Inductor's CUDA graphs (mode="reduce-overhead") run around the operator,
        # not through it: a replay would skip its checks (adapters swapped in place since the
        # capture) and a block prepared again inside a capture would take its weights from the
        # graph's private pool
        tags = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()

        @torch.library.custom_op("fusedk_diffusers::block", mutates_args=(), tags=tags)
        def block(kind: int, handle: torch.Tensor, xs: list[torch.Tensor]) -> list[torch.Tensor]:
            return _KINDS[kind].run_op(_BLOCKS[int(handle)](), xs)

        @block.register_fake
        def _(kind, handle, xs):
            return _KINDS[kind].op[1](xs)
        _BLOCK_OP.append(block)
    return _BLOCK_OP[0]

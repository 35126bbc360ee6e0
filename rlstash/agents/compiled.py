"""Agent updates that cost only their arithmetic: flat fused Adam, and the same step as one
pure function of tensors for ``torch.compile`` and CUDA graphs.

Every trained network group (SAC's actor, its critics, its temperature) is a :class:`FlatAdam`:
its parameters are views of one flat vector (:mod:`rlstash.agents.flat`) and Adam (fused) steps
that vector. The eager update is the usual autograd one::

    norm = group.step(loss, max_grad_norm)          # zero_grad, backward, clip, Adam

The compiled update (``config.compile=True``) runs the *same loss code* as a function of the
flat vectors and takes the gradient with ``torch.func``, then the same Adam arithmetic in place
on the optimizer's own state tensors, so the whole step (forward, backward, clipping, Adam,
Polyak) is one graph with no autograd engine, no ``torch.optim`` Python and no host reads::

    params = Functional(agent.nets, groups)         # names -> flat groups
    grad, (loss, aux) = params.grad(loss_fn, "critic", *tensors)   # loss_fn uses agent.nets
    norm = group.apply(grad, max_grad_norm)         # Adam on group.flat.param, in place

Everything that varies between updates enters as a tensor (the batch, the noise drawn from the
agent's generator outside the step, the learning rate, the Polyak weight), so one compilation
serves the whole run: the step reads no Python counter and branches on no tensor value. On CUDA
:class:`GraphedStep` captures such a step once and replays it (static input buffers).

``torch.optim.Adam`` keeps the state (``exp_avg``, ``exp_avg_sq``, ``step``), so checkpoints
and the eager path see the same optimizer whichever path ran.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from rlstash.agents.flat import FlatParams

BETAS = (0.9, 0.999)
GRAPH_DEVICES = ("cuda",)  # where compiled steps are also captured into CUDA graphs
BACKEND = "inductor"  # torch.compile backend of the steps (tests use "aot_eager": same tracing)


def _no_capture_check() -> None:
    """An optimizer whose parameters are not on a CUDA device is never in a CUDA graph."""


def skip_capture_check(opt: torch.optim.Optimizer) -> None:
    """Stop ``opt.step()`` from asking CUDA whether a graph is being captured.

    A CUDA build of torch asks at every step of every optimizer, CPU ones included
    (``Optimizer._accelerator_graph_capture_health_check``: ``is_available`` then the current
    stream's capture status), so a CPU trainer on a machine with a GPU initialises CUDA in its
    first update (invariant I1; seen on an H100, issue 28). Parameters off the GPU cannot be
    captured: the question has one answer. Both of torch's names for the check are covered."""
    for name in ("_accelerator_graph_capture_health_check", "_cuda_graph_capture_health_check"):
        setattr(opt, name, _no_capture_check)


class FlatAdam:
    """The trainable parameters of ``modules`` as one flat vector, with fused Adam on it."""

    def __init__(self, modules: Sequence[nn.Module], lr: float, eps: float = 1e-8):
        self.modules = list(modules)
        self.flat = FlatParams(nn.ModuleList(self.modules))
        param = self.flat.param
        try:
            self.opt = torch.optim.Adam([param], lr=lr, eps=eps, betas=BETAS, fused=True)
        except (RuntimeError, ValueError, TypeError):  # a device without fused Adam
            self.opt = torch.optim.Adam([param], lr=lr, eps=eps, betas=BETAS, foreach=True)
        if param.device.type not in ("cuda", "xpu"):  # devices with graph capture
            skip_capture_check(self.opt)
        # the state Adam would create on its first step, created now (the compiled step uses it)
        self.opt.state[param] = {
            "step": torch.zeros((), dtype=torch.float32, device=param.device),
            "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
        }
        self.lr = torch.tensor(float(lr), device=param.device)  # the compiled step's lr
        self.eps = float(eps)  # (the step reads no param_groups: Dynamo would guard on lr)

    def set_lr(self, lr: float) -> None:
        """The step size of both paths (a host write: no read, no recompilation)."""
        for group in self.opt.param_groups:
            group["lr"] = lr
        self.lr.fill_(lr)

    def step(self, loss: torch.Tensor, max_grad_norm: float | None = None) -> torch.Tensor | float:
        """Eager: zero_grad, backward, clip the global norm (if given), Adam; returns the norm
        before clipping (0-dim tensor) or 0.0 unclipped."""
        self.flat.zero_grad()
        loss.backward()
        norm: torch.Tensor | float = 0.0
        if max_grad_norm is not None:
            norm = self.flat.clip_grad_norm_(max_grad_norm).detach()
        self.opt.step()
        return norm

    @torch.no_grad()
    def fused_step(self, max_grad_norm: float | None = None) -> torch.Tensor:
        """:meth:`step` for a gradient already in ``flat.grad`` (written out, as
        :mod:`rlstash.agents.ppo_grad` does): clip, then Adam's fused kernel called directly,
        without ``torch.optim``'s per-step Python (~70 us, 8x the kernel on a small net); the
        same arithmetic as ``opt.step()``. Returns the norm before clipping (0-dim; 0 when
        unclipped)."""
        grad, param = self.flat.grad, self.flat.param
        if max_grad_norm is not None:
            norm = self.flat.clip_grad_norm_(max_grad_norm)
        else:
            norm = torch.zeros((), device=grad.device)
        group = self.opt.param_groups[0]
        if not group.get("fused"):
            param.grad = grad
            self.opt.step()
            return norm
        state = self.opt.state[param]
        state["step"].add_(1)
        torch._fused_adam_(
            [param], [grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]],
            amsgrad=False, lr=group["lr"], beta1=group["betas"][0], beta2=group["betas"][1],
            weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
            grad_scale=None, found_inf=None,
        )  # fmt: skip
        return norm

    def apply(self, grad: torch.Tensor, max_grad_norm: float | None = None) -> torch.Tensor:
        """Functional: the same clipping and Adam step as :meth:`step`, from ``grad``, in place
        on the flat vector and the optimizer's state tensors; returns the norm (0-dim)."""
        norm = torch.linalg.vector_norm(grad)
        if max_grad_norm is not None:
            grad = grad * (max_grad_norm / (norm + 1e-6)).clamp(max=1.0)
        state = self.opt.state[self.flat.param]
        adam_update(
            self.flat.param.detach(), grad, state["exp_avg"], state["exp_avg_sq"],
            state["step"], self.lr, self.eps,
        )  # fmt: skip
        return norm if max_grad_norm is not None else torch.zeros_like(norm)

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state dict (one parameter: the flat vector)."""
        return self.opt.state_dict()

    def load_state_dict(self, state: Mapping[str, Any], name: str = "optims") -> None:
        """Load an optimizer state: this format (one flat parameter), or the per-parameter one
        of ``torch.optim.Adam`` over the same modules' parameters (checkpoints written before
        the flat vector: each moment is flattened and concatenated in parameter order; the
        step count is the largest one; parameters without state start at zero)."""
        state = flat_adam_state(state, self.flat.params, name)
        self.opt.load_state_dict(copy.deepcopy(state))  # torch keeps the given tensors: copy
        param = self.flat.param
        current = self.opt.state.get(param, {})
        if not all(key in current for key in ("step", "exp_avg", "exp_avg_sq")):  # no step yet
            self.opt.state[param] = {
                "step": torch.zeros((), dtype=torch.float32, device=param.device),
                "exp_avg": torch.zeros_like(param),
                "exp_avg_sq": torch.zeros_like(param),
            }

    def state_tensors(self) -> list[torch.Tensor]:
        """Every tensor the step mutates (parameters and Adam state): a graph's static memory."""
        state = self.opt.state[self.flat.param]
        return [self.flat.param, state["exp_avg"], state["exp_avg_sq"], state["step"]]


def flat_adam_state(
    state: Mapping[str, Any], params: Sequence[torch.Tensor], name: str
) -> dict[str, Any]:
    """An Adam state dict over the flat vector of ``params`` (see :meth:`FlatAdam.
    load_state_dict`): returned as given when it already has one parameter of that size, else
    converted from the per-parameter layout. ValueError (naming ``name``) when neither fits."""
    total = sum(p.numel() for p in params)
    groups = state.get("param_groups") if isinstance(state, Mapping) else None
    if not isinstance(groups, list) or not groups or "state" not in state:
        raise ValueError(f"{name}: expected a torch.optim.Adam state dict, got {type(state)}")
    ids = [i for group in groups for i in group["params"]]
    per_param = state["state"]
    moments = [per_param.get(i, {}).get("exp_avg") for i in ids]
    if len(ids) == 1 and (moments[0] is None or moments[0].shape == (total,)):
        return dict(state)  # the flat format (or an optimizer that never stepped)
    if len(ids) != len(params):
        raise ValueError(
            f"{name}: the optimizer state holds {len(ids)} parameters, this agent's group "
            f"{len(params)} (flat: 1); the checkpoint is of a different network layout"
        )
    exp_avg, exp_avg_sq, steps = [], [], []
    for i, p in zip(ids, params):
        entry = per_param.get(i, {})
        for key, out in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
            value = entry.get(key)
            if value is not None and value.numel() != p.numel():
                raise ValueError(
                    f"{name}: parameter {i}'s {key} has {value.numel()} values, the network's "
                    f"parameter {p.numel()}; the checkpoint is of a different network layout"
                )
            flat = value.reshape(-1) if value is not None else torch.zeros(p.numel())
            out.append(flat.to(device=p.device, dtype=p.dtype))
        if "step" in entry:
            steps.append(float(entry["step"]))
    device = params[0].device
    flat_state = {
        "step": torch.tensor(max(steps, default=0.0), dtype=torch.float32, device=device),
        "exp_avg": torch.cat(exp_avg),
        "exp_avg_sq": torch.cat(exp_avg_sq),
    }
    group = {k: v for k, v in groups[0].items() if k != "params"}
    return {"state": {0: flat_state}, "param_groups": [{**group, "params": [0]}]}


@torch.no_grad()
def adam_update(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor,
    lr: torch.Tensor,
    eps: float,
) -> None:
    """Adam (Kingma & Ba; torch.optim.Adam's arithmetic), in place, with tensor step and lr::

    t += 1;  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
    theta <- theta - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    """
    beta1, beta2 = BETAS
    step.add_(1)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias1 = 1 - beta1**step
    bias2_sqrt = (1 - beta2**step).sqrt()
    denom = (exp_avg_sq.sqrt() / bias2_sqrt).add_(eps)
    param.sub_((lr / bias1) * exp_avg / denom)


class _Call(nn.Module):
    """All of an agent's networks under one root, so ``functional_call`` can swap any of their
    parameters while an arbitrary function (the agent's loss code) runs."""

    def __init__(self, nets: Mapping[str, nn.Module]):
        super().__init__()
        self.nets = nn.ModuleDict(dict(nets))

    def forward(self, fn: Callable, *args: Any) -> Any:
        return fn(*args)


class Functional:
    """Runs an agent's loss code with its trained groups' parameters taken from the groups'
    flat vectors (one differentiated), for ``torch.func`` gradients (module docstring)."""

    def __init__(self, nets: Mapping[str, nn.Module], groups: Mapping[str, FlatAdam]):
        self.root = _Call(nets)
        self.groups = dict(groups)
        names = {id(p): name for name, p in self.root.named_parameters(remove_duplicate=False)}
        # per group: (qualified name, offset, numel, shape) of every parameter in its vector
        self.layout: dict[str, list[tuple[str, int, int, torch.Size]]] = {}
        for key, group in self.groups.items():
            rows, offset = [], 0
            for p in group.flat.params:
                if id(p) not in names:
                    raise ValueError(f"groups[{key!r}]: holds a parameter outside nets")
                rows.append((names[id(p)], offset, p.numel(), p.shape))
                offset += p.numel()
            self.layout[key] = rows

    def params(self, key: str, vector: torch.Tensor) -> dict[str, torch.Tensor]:
        """Qualified name -> view of ``vector`` for group ``key``'s parameters."""
        return {
            name: vector[offset : offset + n].view(shape)
            for name, offset, n, shape in self.layout[key]
        }

    def call(self, fn: Callable, wrt: str | None, vector: torch.Tensor | None, *args: Any) -> Any:
        """fn(*args) with every group's parameters read from its flat vector (group ``wrt``'s
        from ``vector``), so the graph reads only the flat vectors."""
        swap: dict[str, torch.Tensor] = {}
        for key, group in self.groups.items():
            source = vector if key == wrt else group.flat.param.detach()
            swap.update(self.params(key, source))
        return torch.func.functional_call(
            self.root, swap, (fn, *args), strict=False, tie_weights=False
        )

    def grad(self, fn: Callable, wrt: str, *args: Any) -> tuple[torch.Tensor, Any]:
        """(d loss / d group ``wrt``'s flat vector, (loss, aux)) where ``fn(*args)`` returns
        (loss, aux)."""

        def loss_of(vector: torch.Tensor) -> tuple[torch.Tensor, Any]:
            return self.call(fn, wrt, vector, *args)

        vector = self.groups[wrt].flat.param.detach()
        return torch.func.grad_and_value(loss_of, has_aux=True)(vector)


def polyak_pairs(
    functional: Functional, key: str, target: str, source: str
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(parameters of net ``target``, views of group ``key``'s flat vector for the matching
    parameters of net ``source``) for an in-graph Polyak update."""
    views = functional.params(key, functional.groups[key].flat.param.detach())
    nets = functional.root.nets
    names = [name for name, _ in nets[target].named_parameters()]
    return [p.detach() for p in nets[target].parameters()], [
        views[f"nets.{source}.{name}"] for name in names
    ]


@torch.no_grad()
def lerp_(targets: list[torch.Tensor], sources: list[torch.Tensor], weight: torch.Tensor) -> None:
    """theta_target <- theta_target + weight (theta - theta_target); ``weight`` a 0-dim tensor
    (tau on update steps, 0 otherwise: no recompilation, no branch in the step)."""
    for t, s in zip(targets, sources):
        t.lerp_(s, weight)


class CompiledStep:
    """``torch.compile`` of a step function, compiled on its first call with given input
    shapes (whose wall time, compilation included, is added to ``timer``: how long compiling
    took, near enough).

    Later calls with inputs seen before (the same structure, shapes, dtypes and devices, and
    the same ``key()``: the agent's settings, which the step reads as constants) skip Dynamo's
    guard evaluation (``skip_guard_eval_unsafe``; ~5% of a SAC update on a CPU core): these
    steps read nothing else that could change (``fullgraph``, no Python counters; a test checks
    one graph per step). Anything unseen goes through the guards (and compiles if it must)."""

    def __init__(self, fn: Callable, timer: list[float], key: Callable[[], Any] = tuple):
        self.fn = torch.compile(
            own_code(fn), backend=BACKEND, dynamic=False, fullgraph=True
        )  # a graph break is an error
        self.timer, self.key = timer, key
        self.seen: set[Any] = set()

    @property
    def compiled(self) -> bool:
        return bool(self.seen)

    def signature(self, args: tuple) -> Any:
        """What Dynamo's guards on the inputs would tell apart (cheaply, in Python)."""
        return (self.key(), *(_describe(a) for a in args))

    def __call__(self, *args: Any) -> Any:
        signature = self.signature(args)
        if SKIP_GUARDS and signature in self.seen:
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return self.fn(*args)
        start = time.perf_counter()
        out = self.fn(*args)
        if not self.seen:
            self.timer[0] += time.perf_counter() - start
        self.seen.add(signature)
        return out


SKIP_GUARDS = True  # (a switch for A/B measurements)


def own_code(fn: Callable) -> Callable:
    """``fn`` called through a function with a code object of its own. Dynamo keeps compiled
    graphs per code object, up to a recompile limit (8; over it ``fullgraph`` fails): without
    this, every agent of a process (a sweep, a test suite) would add its graphs to the same
    ``SAC._step``; with it each step has its own few, freed with the step."""

    def call(*args: Any) -> Any:
        return fn(*args)

    call.__code__ = call.__code__.replace()  # a copy: a distinct code object
    return call


def _describe(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.dtype, x.device, x.requires_grad)
    if isinstance(x, Mapping):
        return tuple((k, _describe(v)) for k, v in x.items())
    if isinstance(x, list | tuple):
        return (type(x), *(_describe(v) for v in x))
    return (type(x), x)


class _CudaGraphs:
    """The CUDA side of :class:`GraphedStep` (tests on CPU pass a fake with these two calls)."""

    @staticmethod
    def warm(fn: Callable, args: tuple) -> Any:
        """Run ``fn(*args)`` on a side stream (as capture needs: warm-up off the default
        stream), ordered after and before the current stream's work."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = fn(*args)
        torch.cuda.current_stream().wait_stream(side)
        return out

    @staticmethod
    def capture(fn: Callable[[], Any]) -> tuple[Any, Any]:
        """(graph, static outputs) of ``fn()`` recorded, not run: replay runs it."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        return graph, out


class GraphedStep:
    """A step captured once into a CUDA graph and replayed (LeanRL's recipe, without tensordict).

    Calls 1..``warmup`` run ``step`` eagerly on a side stream (compilation and allocator warm-up
    happen there; each call is a real update). The next call copies its inputs into static
    buffers, captures ``step`` reading them, and replays; every later call copies its inputs
    into the same buffers and replays. Each call is therefore exactly one step. Inputs must keep
    their shapes, dtypes and non-tensor values (else ValueError: build a new step); the
    returned tensors are clones of the graph's static outputs (the next replay overwrites them).
    Everything the step mutates (parameters, Adam state, targets) must stay at its address:
    rebuild the step after ``load_state_dict`` or ``to`` (the agents do).
    """

    def __init__(self, step: Callable, warmup: int = 2, graphs: Any = None):
        self.step, self.warmup, self.graphs = step, warmup, graphs or _CudaGraphs()
        self.calls = 0
        self.graph: Any = None
        self.spec: Any = None
        self.static_in: list[Any] = []
        self.static_out: Any = None

    def __call__(self, *args: Any) -> Any:
        leaves, spec = torch.utils._pytree.tree_flatten(args)
        if self.calls < self.warmup:
            self.calls += 1
            return self.graphs.warm(self.step, args)
        if self.graph is None:
            self.spec = spec
            self.static_in = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
            static_args = torch.utils._pytree.tree_unflatten(self.static_in, spec)
            self.graph, self.static_out = self.graphs.capture(lambda: self.step(*static_args))
        else:
            self._copy_in(leaves, spec)
        self.calls += 1
        self.graph.replay()
        return torch.utils._pytree.tree_map(
            lambda x: x.clone() if isinstance(x, torch.Tensor) else x, self.static_out
        )

    def _copy_in(self, leaves: list[Any], spec: Any) -> None:
        if spec != self.spec:
            raise ValueError(f"step inputs: expected the structure {self.spec}, got {spec}")
        for i, (static, x) in enumerate(zip(self.static_in, leaves)):
            if isinstance(static, torch.Tensor):
                if (
                    not isinstance(x, torch.Tensor)
                    or x.shape != static.shape
                    or (x.dtype != static.dtype)
                ):
                    got = (tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x
                    raise ValueError(
                        f"step input {i}: a CUDA graph replays static shapes; expected "
                        f"{(tuple(static.shape), static.dtype)}, got {got} (keep the batch size)"
                    )
                static.copy_(x, non_blocking=True)
            elif x != static:
                raise ValueError(
                    f"step input {i}: expected the captured value {static!r}, got {x!r}"
                )


def compiled_step(
    fn: Callable, device: torch.device, timer: list[float], key: Callable[[], Any] = tuple
) -> Callable:
    """``fn`` compiled (:class:`CompiledStep`); on CUDA also graphed (:class:`GraphedStep`)."""
    step: Callable = CompiledStep(fn, timer, key)
    if device.type in GRAPH_DEVICES:
        step = GraphedStep(step, graphs=_CudaGraphs())
    return step

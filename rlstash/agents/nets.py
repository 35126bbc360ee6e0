"""Network building blocks: MLP, the Nature CNN, observation encoders, Polyak averaging.

``make_encoder(obs_shape, net_arch)`` picks the trunk from the observation shape:

- (C, H, W) with H, W >= 36: the Nature CNN (Mnih et al. 2015) -> 512 features; uint8 pixels
  are scaled by 1/255 inside the network (the buffer keeps them uint8). ``net_arch`` is not used.
- (k, obs_dim) with ``history_hidden > 0``: a :class:`HistorySummarizer` LSTM over the window,
  then an MLP of ``net_arch``.
- anything else: flattened, cast to float32, then an MLP of ``net_arch`` (ReLU).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from rlstash.agents.actions import ActionFeatures, ActionHead, EmbeddingActionHead, LinearActionHead
from rlstash.agents.history import HistorySummarizer


class MLP(nn.Sequential):
    """in_dim -> hidden[0] -> ... -> hidden[-1] (-> out_dim), ReLU between layers.

    Without ``out_dim`` the last hidden layer (after its activation) is the output."""

    def __init__(self, in_dim: int, hidden: Sequence[int], out_dim: int | None = None):
        layers: list[nn.Module] = []
        dim = in_dim
        for width in hidden:
            layers += [nn.Linear(dim, width), nn.ReLU()]
            dim = width
        if out_dim is not None:
            layers.append(nn.Linear(dim, out_dim))
            dim = out_dim
        super().__init__(*layers)
        self.out_dim = dim


class EnsembleMLP(nn.Module):
    """``members`` independent MLPs (in_dim -> hidden... -> out_dim, ReLU) evaluated as one:
    each layer's weights are stacked [M, in, out], so a layer is one batched matmul for all
    members (a twin critic costs the kernel launches and autograd nodes of one MLP).

    Each member is initialized like ``nn.Linear`` (weights and biases U(-1/sqrt(in), 1/sqrt(in))).
    """

    def __init__(self, in_dim: int, hidden: Sequence[int], out_dim: int, members: int = 2):
        super().__init__()
        dims = [in_dim, *hidden, out_dim]
        self.members, self.out_dim = members, out_dim
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(dims[:-1], dims[1:]):
            bound = 1.0 / math.sqrt(fan_in)
            self.weights.append(
                nn.Parameter(torch.empty(members, fan_in, fan_out).uniform_(-bound, bound))
            )
            self.biases.append(
                nn.Parameter(torch.empty(members, 1, fan_out).uniform_(-bound, bound))
            )

    def forward(
        self, x: torch.Tensor, detach: bool = False, member: int | None = None
    ) -> torch.Tensor:
        """x [B, in] (shared by all members) or [M, B, in] -> [M, B, out]; with ``member``
        only that member: x [B, in] -> [B, out]. With ``detach`` the weights take no gradient
        (gradients still flow to ``x``)."""
        if member is not None:
            return self._member(x, member, detach)
        if x.dim() == 2:
            x = x.expand(self.members, *x.shape)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            if detach:
                w, b = w.detach(), b.detach()
            if i == last and self.out_dim == 1:  # a dot product per row, not a batched GEMV
                x = (x * w.transpose(1, 2)).sum(-1, keepdim=True) + b  # (-2% of a SAC update)
            else:
                x = torch.baddbmm(b, x, w)
            if i < last:
                x = torch.relu(x)
        return x

    def _member(self, x: torch.Tensor, member: int, detach: bool) -> torch.Tensor:
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            w, b = w[member], b[member]  # [in, out], [1, out]
            if detach:
                w, b = w.detach(), b.detach()
            x = torch.addmm(b, x, w)  # [B, out]
            if i < last:
                x = torch.relu(x)
        return x


class TwinCritic(nn.Module):
    """Q_1(s, a), Q_2(s, a) -> [2, B]: two independent critics over features(obs) concatenated
    with a in [-1, 1]^A, evaluated as one :class:`EnsembleMLP` (one batched matmul per layer).
    Pixel observations get one encoder per critic."""

    def __init__(self, obs_shape: tuple[int, ...], act_dim: int, net_arch: tuple[int, ...]):
        super().__init__()
        self.features = nn.ModuleList([make_encoder(obs_shape, ()) for _ in range(2)])
        self.shared = not any(True for _ in self.features.parameters())  # flatten: compute once
        self.mlp = EnsembleMLP(self.features[0].out_dim + act_dim, net_arch, 1, members=2)

    def forward(
        self,
        obs: torch.Tensor,
        action: torch.Tensor,
        detach: bool = False,
        member: int | None = None,
    ) -> torch.Tensor:
        """[2, B]; with ``member`` only that critic's Q [B] (TD3's actor reads Q_1 only).
        With ``detach`` the critics' weights take no gradient (the actor loss backpropagates
        through the critics to the action only)."""
        if member is not None:
            with frozen(self.features) if detach else contextlib.nullcontext():
                x = torch.cat([self.features[member](obs), action], dim=-1)  # [B, F + A]
            return self.mlp(x, detach=detach, member=member).squeeze(-1)
        if self.shared:
            x = torch.cat([self.features[0](obs), action], dim=-1)  # [B, F + A]
        else:
            with frozen(self.features) if detach else contextlib.nullcontext():
                x = torch.stack(
                    [torch.cat([f(obs), action], dim=-1) for f in self.features]
                )  # [2, B, F + A]
        return self.mlp(x, detach=detach).squeeze(-1)


class NatureCNN(nn.Module):
    """Conv 32x8/4 -> 64x4/2 -> 64x3/1 -> Linear 512, ReLU; uint8 input scaled by 1/255.

    The input is made channels-last (NHWC strides; the logical shape stays [B, C, H, W]; the
    weights keep theirs): on CPUs oneDNN's NHWC kernels make a batch-32 forward + backward
    ~20% faster (measured for issue 14, see bench/results/learn_atari.md)."""

    def __init__(self, obs_shape: Sequence[int], features: int = 512):
        super().__init__()
        channels, height, width = obs_shape
        self.convs = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        for k, s in ((8, 4), (4, 2), (3, 1)):
            height, width = (height - k) // s + 1, (width - k) // s + 1
        self.fc = nn.Sequential(nn.Linear(64 * height * width, features), nn.ReLU())
        self.out_dim = features

    def forward(self, obs: torch.Tensor) -> torch.Tensor:  # [B, C, H, W] -> [B, 512]
        x = obs.contiguous(memory_format=torch.channels_last)  # same values, NHWC strides
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        return self.fc(self.convs(x))


class Flatten(nn.Module):
    """[B, *shape] (any number dtype) -> [B, prod(shape)] float32."""

    def __init__(self, obs_shape: Sequence[int]):
        super().__init__()
        self.out_dim = int(math.prod(obs_shape))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.reshape(obs.shape[0], -1).float()


class Encoder(nn.Module):
    """Observation [B, *obs_shape] -> features [B, out_dim]."""

    def __init__(self, features: nn.Module, mlp: nn.Module, out_dim: int):
        super().__init__()
        self.features, self.mlp, self.out_dim = features, mlp, out_dim

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.features(obs))


def is_image(obs_shape: Sequence[int]) -> bool:
    return len(obs_shape) == 3 and obs_shape[1] >= 36 and obs_shape[2] >= 36


def make_encoder(
    obs_shape: Sequence[int], net_arch: Sequence[int], history_hidden: int = 0
) -> Encoder:
    """The trunk for ``obs_shape`` (see the module docstring); ``.out_dim`` is its width."""
    obs_shape = tuple(int(d) for d in obs_shape)
    if not obs_shape or any(d <= 0 for d in obs_shape):
        raise ValueError(f"obs_shape: expected positive dimensions, got {obs_shape}")
    if is_image(obs_shape):
        cnn = NatureCNN(obs_shape)
        return Encoder(cnn, nn.Identity(), cnn.out_dim)
    if history_hidden > 0:
        if len(obs_shape) != 2:
            raise ValueError(
                f"history_hidden: needs windowed observations (k, obs_dim), got obs_shape {obs_shape}"
            )
        features = HistorySummarizer(obs_shape[1], history_hidden, window=obs_shape[0])
    else:
        features = Flatten(obs_shape)
    mlp = MLP(features.out_dim, net_arch)
    return Encoder(features, mlp, mlp.out_dim)


class DiscreteQNet(nn.Module):
    """Encoder + action head: ``embed(obs)`` gives u [B, k]; ``head`` scores actions from u."""

    def __init__(self, encoder: Encoder, head: ActionHead):
        super().__init__()
        self.encoder, self.head = encoder, head

    def embed(self, obs: torch.Tensor) -> torch.Tensor:  # [B, *obs_shape] -> [B, k]
        return self.head.project(self.encoder(obs))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """All scores [B, n] (small n only; the agents use chunked reductions)."""
        return self.head.scores(self.embed(obs))


def make_discrete_net(
    obs_shape: Sequence[int],
    n_actions: int,
    net_arch: Sequence[int],
    action_head: str = "linear",
    embed_dim: int = 64,
    features: ActionFeatures | None = None,
    learn_embeddings: bool = True,
    history_hidden: int = 0,
) -> DiscreteQNet:
    """Encoder for ``obs_shape`` + a linear or embedding head over ``n_actions`` actions."""
    encoder = make_encoder(obs_shape, net_arch, history_hidden)
    if action_head == "linear":
        if features is not None:
            raise ValueError(
                "action_features: only used with action_head='embedding', got 'linear'"
            )
        head: ActionHead = LinearActionHead(encoder.out_dim, n_actions)
    elif action_head == "embedding":
        head = EmbeddingActionHead(
            encoder.out_dim, n_actions, embed_dim, features, learn_embeddings
        )
    else:
        raise ValueError(f"action_head: expected 'linear' or 'embedding', got {action_head!r}")
    return DiscreteQNet(encoder, head)


class LogAlpha(nn.Module):
    """The entropy temperature, learned in log space: alpha = exp(log_alpha) > 0."""

    def __init__(self, init_alpha: float):
        super().__init__()
        if not init_alpha > 0:
            raise ValueError(f"init_alpha: expected > 0, got {init_alpha}")
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_alpha), dtype=torch.float32))

    def forward(self) -> torch.Tensor:
        return self.log_alpha.exp()


@contextlib.contextmanager
def frozen(*modules: nn.Module) -> Iterator[None]:
    """Parameters of ``modules`` take no gradient inside the block (gradients still flow
    *through* them to their inputs): the actor loss backpropagates through the critics
    without computing the critics' weight gradients."""
    params = [p for m in modules for p in m.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, tau: float) -> None:
    """theta_target <- (1 - tau) theta_target + tau theta_source (tau = 1: hard copy).
    Buffers (e.g. normalization statistics) are copied."""
    t_params, s_params = list(target.parameters()), list(source.parameters())
    if len(t_params) != len(s_params):
        raise ValueError(
            f"polyak_update: target has {len(t_params)} parameters, source {len(s_params)}"
        )
    if tau == 1.0:
        torch._foreach_copy_(t_params, s_params)
    else:
        torch._foreach_lerp_(t_params, s_params, tau)
    for t_buf, s_buf in zip(target.buffers(), source.buffers()):
        t_buf.copy_(s_buf)


def param_bytes(*modules: nn.Module) -> int:
    """Bytes held by parameters and buffers (each tensor counted once)."""
    seen: dict[int, int] = {}
    for module in modules:
        for t in list(module.parameters()) + list(module.buffers()):
            seen[id(t)] = t.numel() * t.element_size()
    return sum(seen.values())

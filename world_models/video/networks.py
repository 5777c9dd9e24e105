"""Building blocks: a frame autoencoder, a small U-Net with adaptive group norm, a bag-of-words task encoder and
the per-frame heads."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from wmrl.core.text import TaskEncoder  # noqa: F401  (the world model's instruction encoder)


def _groups(c: int) -> int:
    return min(8, c) if c % min(8, c) == 0 else 1


CHANNELS_LAST = True


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """x (N, C, H, W) stored pixel-major: oneDNN's convolutions on 64x64 frames then run 1.3-1.8x faster on a CPU
    than on the plain layout (`wmrl bench conv-layout`; the outputs are the same, tested). Frames gathered from
    (N, H, W, 3) arrays and permuted already are pixel-major (the autoencoder's training batches), so the gain is
    where the input was not: latents being decoded, and the change mask's stacked inputs (the warped start frame comes
    out of grid_sample plain). The weights stay contiguous (safetensors saves only contiguous tensors); callers get
    `.contiguous()` outputs back. The 16x16 U-Net gains nothing and is left as it is. `CHANNELS_LAST = False` turns
    it off (the benchmark's baseline)."""
    return x.contiguous(memory_format=torch.channels_last) if CHANNELS_LAST else x


class FrameAutoencoder(nn.Module):
    """64x64x3 -> (latent_channels, 16, 16) and back; shared by all cameras (Ctrl-World's common latent layout).
    Deterministic with a small latent L2 penalty, which keeps latents near unit scale for diffusion."""

    def __init__(self, latent_channels: int = 4, width: int = 32):
        super().__init__()
        w = width
        self.enc = nn.Sequential(
            nn.Conv2d(3, w, 3, padding=1), nn.SiLU(),
            nn.Conv2d(w, w, 4, stride=2, padding=1), nn.GroupNorm(_groups(w), w), nn.SiLU(),
            nn.Conv2d(w, 2 * w, 4, stride=2, padding=1), nn.GroupNorm(_groups(2 * w), 2 * w), nn.SiLU(),
            nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.SiLU(),
            nn.Conv2d(2 * w, latent_channels, 1))
        self.dec = nn.Sequential(
            nn.Conv2d(latent_channels, 2 * w, 3, padding=1), nn.SiLU(),
            nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.GroupNorm(_groups(2 * w), 2 * w), nn.SiLU(),
            nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(2 * w, w, 3, padding=1), nn.GroupNorm(_groups(w), w), nn.SiLU(),
            nn.Upsample(scale_factor=2, mode="nearest"), nn.Conv2d(w, w, 3, padding=1), nn.SiLU(),
            nn.Conv2d(w, 3, 3, padding=1))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x: float (N, 3, 64, 64) in [-1, 1]."""
        return self.enc(channels_last(x)).contiguous()

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.dec(channels_last(z)).contiguous()


class FourierEmbedding(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.register_buffer("freqs", torch.randn(dim // 2) * 4.0, persistent=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = 2 * math.pi * x[:, None] * self.freqs[None]
        return torch.cat([f.cos(), f.sin()], dim=-1)


class AdaGroupNorm(nn.Module):
    """GroupNorm whose scale and shift come from the conditioning vector (DIAMOND's action conditioning)."""

    def __init__(self, channels: int, cond_dim: int):
        super().__init__()
        self.norm = nn.GroupNorm(_groups(channels), channels, affine=False)
        self.proj = nn.Linear(cond_dim, 2 * channels)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        scale, shift = self.proj(cond)[:, :, None, None].chunk(2, dim=1)
        return self.norm(x) * (1 + scale) + shift


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, cond_dim: int):
        super().__init__()
        self.n1, self.c1 = AdaGroupNorm(cin, cond_dim), nn.Conv2d(cin, cout, 3, padding=1)
        self.n2, self.c2 = AdaGroupNorm(cout, cond_dim), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()
        nn.init.zeros_(self.c2.weight)
        nn.init.zeros_(self.c2.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.c1(F.silu(self.n1(x, cond)))
        h = self.c2(F.silu(self.n2(h, cond)))
        return self.skip(x) + h


class UNet(nn.Module):
    """Two-level U-Net over latent frames; every ResBlock is conditioned through AdaGroupNorm."""

    def __init__(self, cin: int, cout: int, cond_dim: int, channels: tuple[int, ...] = (64, 128)):
        super().__init__()
        c0 = channels[0]
        self.inp = nn.Conv2d(cin, c0, 3, padding=1)
        self.down, self.downsample = nn.ModuleList(), nn.ModuleList()
        prev, skips = c0, []
        for i, c in enumerate(channels):
            self.down.append(ResBlock(prev, c, cond_dim))
            skips.append(c)
            prev = c
            self.downsample.append(nn.Conv2d(c, c, 3, stride=2, padding=1) if i < len(channels) - 1 else nn.Identity())
        self.mid = ResBlock(prev, prev, cond_dim)
        self.up, self.upsample = nn.ModuleList(), nn.ModuleList()
        for i, c in reversed(list(enumerate(channels))):
            self.upsample.append(nn.Upsample(scale_factor=2, mode="nearest") if i < len(channels) - 1 else nn.Identity())
            self.up.append(ResBlock(prev + skips[i], c, cond_dim))
            prev = c
        self.out_norm = nn.GroupNorm(_groups(prev), prev)
        self.out = nn.Conv2d(prev, cout, 3, padding=1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        hs = []
        for block, down in zip(self.down, self.downsample):
            h = block(h, cond)
            hs.append(h)
            h = down(h)
        h = self.mid(h, cond)
        for block, up in zip(self.up, self.upsample):
            h = up(h)
            h = block(torch.cat([h, hs.pop()], dim=1), cond)
        return self.out(F.silu(self.out_norm(h)))


class FrameHeads(nn.Module):
    """From one latent frame (and the task): proprioceptive state, success logit, reward, done logit and, when
    `env_state_dim` > 0, the simulator's environment state."""

    def __init__(self, latent_channels: int, state_dim: int, task_dim: int, latent_size: int = 16, width: int = 32,
                 env_state_dim: int = 0):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(latent_channels, width, 3, stride=2, padding=1), nn.SiLU(),
            nn.Conv2d(width, 2 * width, 3, stride=2, padding=1), nn.SiLU(), nn.Flatten())
        flat = 2 * width * ((latent_size + 3) // 4) ** 2
        self.mlp = nn.Sequential(nn.Linear(flat, 128), nn.SiLU(), nn.Linear(128, state_dim + 3 + env_state_dim))
        self.task_proj = nn.Linear(task_dim, 128)
        self.state_dim = state_dim

    def forward(self, z: torch.Tensor, task_emb: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.mlp[0](self.conv(z)) + self.task_proj(task_emb)
        out = self.mlp[2](self.mlp[1](h))
        s = self.state_dim
        res = {"state": out[:, :s], "success_logit": out[:, s], "reward": out[:, s + 1], "done_logit": out[:, s + 2]}
        if out.shape[1] > s + 3:  # privileged simulator state (cube and zone positions), for scripted policies
            res["env_state"] = out[:, s + 3 :]
        return res


class PoseLayer(nn.Module):
    """A fixed camera's view of the arm, rendered from where the hand is: x = a * rgb + (1 - a) * frame0, with the
    colour rgb and the coverage a (per pixel) decoded from the hand's position at the frame and at the start frame
    (N, 6), normalised. An MLP gives an 8x8 map, three upsamplings the image, and a last convolution reads the start
    frame and the pixel's coordinates beside it (the background it paints over the arm's old place is where in the
    image it is). A camera fixed to the world sees the arm as a function of its pose alone (the controller holds the
    hand level and the arm's links follow its position), which the latent dynamics only approximate: on the demo's
    model, held-out motion windows at h16, the front camera's arm pixels were 4.5 dB better than copy-last from the
    generated latents and 9.8 dB from this layer given the recorded hand (5.6 given the state channel's). Trained
    on real frames and recorded positions (`change_mask.fit_pose_layers`); in a rollout it reads the state channel's
    hand, and the change mask weighs it per pixel like its other sources."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.width = width
        self.mlp = nn.Sequential(nn.Linear(6, 256), nn.SiLU(), nn.Linear(256, 256), nn.SiLU(), nn.Linear(256, width * 64))

        def up(i: int, o: int) -> nn.Module:
            return nn.Sequential(nn.Upsample(scale_factor=2), nn.Conv2d(i, o, 3, padding=1), nn.GroupNorm(_groups(o), o), nn.SiLU())

        self.up = nn.Sequential(up(width, width), up(width, width), up(width, width // 2))
        self.head = nn.Conv2d(width // 2 + 5, 4, 3, padding=1)

    def forward(self, hands: torch.Tensor, frame0: torch.Tensor) -> torch.Tensor:
        """hands (N, 6): [the hand at the frame, at the start frame], normalised; frame0 (N, 3, H, W) in [-1, 1] ->
        the frame (N, 3, H, W)."""
        return self.draw(hands, frame0)[0]

    def draw(self, hands: torch.Tensor, frame0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward`'s frame (N, 3, H, W) and the arm's coverage a (N, 1, H, W) in [0, 1] it was drawn with."""
        if hands.shape != (len(frame0), 6):
            raise ValueError(f"hands: expected ({len(frame0)}, 6), got {tuple(hands.shape)}")
        # pixel-major (`channels_last`): on a CPU the nearest upsamplings and convolutions then run faster (rendering
        # 64 frames 2.25x, `wmrl bench conv-layout`), and this layer runs at every decode of a rollout
        x = self.up(channels_last(self.mlp(hands).reshape(-1, self.width, 8, 8)))
        H, W = frame0.shape[-2:]
        if x.shape[-2:] != (H, W):
            x = F.interpolate(x, size=(H, W), mode="bilinear", align_corners=False)
        ys = torch.linspace(-1, 1, H, device=x.device, dtype=x.dtype)[:, None].expand(H, W)
        xs = torch.linspace(-1, 1, W, device=x.device, dtype=x.dtype)[None].expand(H, W)
        o = self.head(channels_last(torch.cat([x, frame0, torch.stack([xs, ys])[None].expand(len(x), -1, -1, -1)], 1)))
        o = o.contiguous()
        a = torch.sigmoid(o[:, :1] - 2.0)
        return a * torch.tanh(o[:, 1:]) + (1 - a) * frame0, a


class ChangeMask(nn.Module):
    """Where a decoded frame may differ from the rollout's start frame: m = sigmoid(CNN(pred, frame0, pred - frame0))
    per pixel, in [0, 1]. A decoded latent change spreads small errors over the whole frame (the background of a
    fixed camera included); the blend frame0 + m * (pred - frame0) keeps the start frame where nothing moved.
    Dilated convolutions (receptive field 31 px) see an arm's extent at 64x64. With `refine` the same network also
    outputs a pixel correction r added to the blend (0.1 r, zero at the start): GameNGen's fine-tuning of the decoder
    on the model's own generated latents, done after the decoder so the pixel identity path stays exact.

    With `warp_pose_dim` P > 0 the start frame is first carried to the frame's pose: an affine warp (a spatial
    transformer, Jaderberg et al. 2015) whose 6 parameters an MLP reads from the start frame's pose and the frame's
    commanded pose (normalised, P entries each), identity at the start. A camera on the hand sees the table shift
    with every small hand motion, so its unchanged start frame is a poor base even where nothing else moved (on
    held-out windows whose hand moves under 2 cm, the best shift of the start frame is 1.9 dB closer to the real
    frame 16 steps on than the frame itself, and that shift follows the hand's motion: correlation 0.93).

    With `keep_unwarped` (needs the warp) the blend has three sources, weighed per pixel by a softmax over three
    logits: the decode, the warped start frame and the start frame as it was. A fixed camera's background, and the
    wrist camera's gripper fingers, do not move with the hand's pose; the warp would carry them along.

    With `read_pose` (needs the warp) the network also reads the pose change, 10 (pose - pose0), as P constant input
    planes: a decode that moves the view while the commanded hand stays still is then told so, where the images
    alone cannot tell a still hand from a slow one.

    With `n_objects` k > 0 (needs `keep_unwarped`) there are k more sources, one per object: the start frame
    translated by that object's image displacement (`camera.object_moves`: the state channel's predicted object and
    hand positions, projected), each allowed only inside a window around where the object now is (its logit plus
    log(window)). A pushed cube is carried as the rigid patch it is, instead of being redrawn from a latent that
    blurs it (on held-out motion windows of the CPU model the cubes' pixels were 0.5-0.7 dB better than copy-last
    while the arm's were 3 dB better). The network also reads each translated frame and its window.

    With `coords` the network also reads two planes of the pixel's x and y (CoordConv, Liu et al. 2018): what stays
    put in a camera's image is tied to where in the image it is (the wrist camera's fingers, a fixed camera's table
    edge), which convolutions alone can only infer from the image's borders.

    With `pose_layer` (needs `keep_unwarped`) one more source: the arm rendered from the hand's position
    (`PoseLayer`, trained apart on real frames and frozen while the mask fits), for a camera fixed to the world."""

    def __init__(self, width: int = 16, refine: bool = False, warp_pose_dim: int = 0, keep_unwarped: bool = False,
                 read_pose: bool = False, n_objects: int = 0, coords: bool = False, pose_layer: bool = False):
        super().__init__()
        if (keep_unwarped or read_pose) and not warp_pose_dim:
            raise ValueError("keep_unwarped and read_pose come with the warp of the start frame: they need warp_pose_dim > 0")
        if n_objects and not keep_unwarped:
            raise ValueError("object sources join the softmax of three sources: n_objects needs keep_unwarped")
        if pose_layer and not keep_unwarped:
            raise ValueError("the pose layer joins the softmax of three sources: pose_layer needs keep_unwarped")
        self.refine, self.keep_unwarped, self.read_pose, self.n_objects = refine, keep_unwarped, read_pose, n_objects
        self.coords = coords
        # inputs: the decode, the base (and the unwarped start frame), the decode's difference from each (and the
        # pose change); outputs: the blend's logit (a softmax's three with three sources), the correction's 3 channels
        n_in, n_logits = (15, 3) if keep_unwarped else (9, 1)
        n_in += (warp_pose_dim if read_pose else 0) + 4 * n_objects + 2 * coords + 3 * pose_layer
        n_logits += n_objects + pose_layer
        self.n_base = 3 + pose_layer if keep_unwarped else 1  # sources before the objects'
        self.layer = PoseLayer() if pose_layer else None
        self.n_logits = n_logits
        self.net = nn.Sequential(nn.Conv2d(n_in, width, 3, padding=1), nn.SiLU(),
                                 nn.Conv2d(width, width, 3, padding=2, dilation=2), nn.SiLU(),
                                 nn.Conv2d(width, width, 3, padding=4, dilation=4), nn.SiLU(),
                                 nn.Conv2d(width, n_logits + (3 if refine else 0), 3, padding=1))
        nn.init.zeros_(self.net[-1].bias)
        self.net[-1].bias.data[0] = 2.0  # starts near the plain decode (weight 0.88; 0.79 of three)
        if refine:  # and with no correction
            nn.init.zeros_(self.net[-1].weight[n_logits:])
        self.warp = None
        if warp_pose_dim:
            self.warp = nn.Sequential(nn.Linear(2 * warp_pose_dim, 64), nn.SiLU(), nn.Linear(64, 6))
            nn.init.zeros_(self.warp[-1].weight)  # the identity warp at the start
            nn.init.zeros_(self.warp[-1].bias)

    def warp_frame(self, frame0: torch.Tensor, pose: torch.Tensor | None, pose0: torch.Tensor | None) -> torch.Tensor:
        """The start frame (N, 3, H, W) carried to each frame's pose (N, P) from its own (N, P); itself without a warp.
        The pose change enters scaled by 10: a centimetre's hand motion is ~1/20 of a normalised pose's range."""
        if self.warp is None:
            return frame0
        if pose is None or pose0 is None:
            raise ValueError("this change mask warps the start frame by the pose change: pass each frame's pose and pose0")
        theta = self.warp(torch.cat([pose0, 10.0 * (pose - pose0)], -1)).reshape(-1, 2, 3)
        theta = theta + torch.eye(2, 3, device=theta.device, dtype=theta.dtype)
        grid = F.affine_grid(theta, list(frame0.shape), align_corners=False)
        return F.grid_sample(frame0, grid, padding_mode="border", align_corners=False)

    def object_sources(self, frame0: torch.Tensor, objects: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The start frame (N, 3, H, W) translated by each object's shift, (N, k, 3, H, W), and each object's window
        (N, k, H, W), from `objects` (N, k, 5) = [shift xy, centre xy, window] (`camera.object_moves`)."""
        N, k = objects.shape[:2]
        if objects.shape != (len(frame0), self.n_objects, 5):
            raise ValueError(f"objects: expected ({len(frame0)}, {self.n_objects}, 5), got {tuple(objects.shape)}")
        theta = torch.eye(2, 3, device=frame0.device, dtype=frame0.dtype).repeat(N * k, 1, 1)
        theta[:, :, 2] = -objects[..., :2].reshape(N * k, 2)  # sample at x - shift: content moves by the shift
        f = frame0.repeat_interleave(k, 0)
        grid = F.affine_grid(theta, list(f.shape), align_corners=False)
        moved = F.grid_sample(f, grid, padding_mode="border", align_corners=False).reshape(N, k, *frame0.shape[1:])
        H, W = frame0.shape[-2:]
        ys = (torch.arange(H, device=frame0.device, dtype=frame0.dtype) + 0.5) / H * 2 - 1
        xs = (torch.arange(W, device=frame0.device, dtype=frame0.dtype) + 0.5) / W * 2 - 1
        c, w = objects[..., 2:4, None, None], objects[..., 4, None, None]
        d2 = (xs - c[..., 0, :, :]) ** 2 + (ys[:, None] - c[..., 1, :, :]) ** 2
        return moved, torch.exp(-d2 / (2 * w**2))

    def forward(self, pred: torch.Tensor, frame0: torch.Tensor, pose: torch.Tensor | None = None,
                pose0: torch.Tensor | None = None, objects: torch.Tensor | None = None,
                hands: torch.Tensor | None = None, rendered: torch.Tensor | None = None,
                weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """pred, frame0 (N, 3, H, W) in [-1, 1] -> the blended (and, with `refine`, corrected) frame (N, 3, H, W).
        With a warp, `pose` and `pose0` (N, P): the normalised commanded pose of each frame and of the start frame.
        With object sources, `objects` (N, k, 5): each object's move in this camera (`camera.object_moves`).
        With the pose layer, `hands` (N, 6): the hand at each frame and at its start frame, normalised; or `rendered`
        (N, 3, H, W), the layer's frame for them already drawn (a frozen layer draws the same frame at every step of
        the mask's fit, `fit_change_mask`). `weights` (with three or more sources): also return the blend's weight
        per source and pixel (N, sources, H, W): [decode, warped start frame, start frame, (pose layer,) objects]."""
        base = self.warp_frame(frame0, pose, pose0)
        inputs = [pred, base, frame0, pred - base, pred - frame0] if self.keep_unwarped else [pred, base, pred - base]
        sources = [pred, base, frame0]
        if self.layer is not None:
            if rendered is None:
                if hands is None:
                    raise ValueError("this change mask has a pose layer: pass `hands`, the hand at each frame and at the "
                                     "start (or the layer's `rendered` frames)")
                rendered = self.layer(hands, frame0)
            elif rendered.shape != pred.shape:
                raise ValueError(f"rendered: expected {tuple(pred.shape)}, got {tuple(rendered.shape)}")
            inputs.append(rendered)
            sources.append(rendered)
        if self.read_pose:
            inputs.append((10.0 * (pose - pose0))[:, :, None, None].expand(-1, -1, *pred.shape[-2:]))
        if self.n_objects:
            if objects is None:
                raise ValueError("this change mask carries each object's patch of the start frame: pass `objects`")
            moved, win = self.object_sources(frame0, objects)
            inputs += [moved.flatten(1, 2), win]
        if self.coords:
            H, W = pred.shape[-2:]
            ys = torch.linspace(-1, 1, H, device=pred.device, dtype=pred.dtype)[:, None].expand(H, W)
            xs = torch.linspace(-1, 1, W, device=pred.device, dtype=pred.dtype)[None].expand(H, W)
            inputs.append(torch.stack([xs, ys])[None].expand(len(pred), -1, -1, -1))
        o = self.net(channels_last(torch.cat(inputs, 1))).contiguous()
        if self.keep_unwarped:
            logits, nb = o[:, : self.n_logits], self.n_base
            if self.n_objects:  # an object's source only near where the object now is
                logits = torch.cat([logits[:, :nb], logits[:, nb:] + torch.log(win + 1e-6)], 1)
            w = torch.softmax(logits, 1)
            x = sum(w[:, j : j + 1] * src for j, src in enumerate(sources))
            if self.n_objects:
                x = x + (w[:, nb:, None] * moved).sum(1)
        else:
            if weights:
                raise ValueError("weights: a mask of one source (no keep_unwarped) has no per-source weights")
            x = base + torch.sigmoid(o[:, :1]) * (pred - base)
        x = x + 0.1 * o[:, self.n_logits :] if self.refine else x
        return (x, w) if weights else x

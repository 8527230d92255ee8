"""The CNN set of issue 44: networks people deploy on CPUs, built from transformers configs (random
weights, batch norms given real statistics) and small hand-written blocks of the families
transformers does not ship (ShuffleNet, SqueezeNet, MobileNetV3), 224 px."""
from __future__ import annotations

import torch


def _bn_statistics(m, images=4, size=224):
    """Batch norms given the statistics of the maps they see: one pass in training mode over random images
    (momentum None: their plain mean and variance), then eval. Set at random, the statistics had let
    MobileNetV1/V2, EfficientNet-B0 and MobileViT-S compute the same output for any input (each norm's
    shift drowned the signal of layers initialized at std 0.02), so an error measured on them said
    nothing."""
    norms = [mod for mod in m.modules() if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return m.eval()
    for mod in norms:
        mod.reset_running_stats()
        mod.momentum = None
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        m.train()(torch.randn(images, 3, size, size, generator=g))
    return m.eval()


def _he_init(m):
    """Convs and linear layers at He's scale (as trained ReLU networks keep their maps' size), biases
    small: at PyTorch's default scale a hand-written net's signal fades a few times a layer, and
    SqueezeNet's and VGG's outputs (no norms to restore it) were their last biases whatever the input."""
    g = torch.Generator().manual_seed(3)
    for mod in m.modules():
        if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
            fan_in = mod.weight[0].numel()
            with torch.no_grad():
                mod.weight.copy_(torch.randn(mod.weight.shape, generator=g) * (2.0 / fan_in) ** 0.5)
                if mod.bias is not None:
                    mod.bias.copy_(torch.randn(mod.bias.shape, generator=g) * 0.01)
    return m


def _hf(model_cls, config_cls, **cfg):
    def build(batch=1):
        import transformers as T
        torch.manual_seed(0)
        m = getattr(T, model_cls)(getattr(T, config_cls)(**cfg)).eval()
        return _bn_statistics(m), (torch.randn(batch, 3, 224, 224),)
    return build


class ShuffleBlock(torch.nn.Module):
    """ShuffleNetV2's unit: split, 1x1 -> 3x3 depthwise -> 1x1 on one half, concat, channel shuffle."""

    def __init__(self, c):
        super().__init__()
        h = c // 2
        self.branch = torch.nn.Sequential(
            torch.nn.Conv2d(h, h, 1, bias=False), torch.nn.BatchNorm2d(h), torch.nn.ReLU(),
            torch.nn.Conv2d(h, h, 3, padding=1, groups=h, bias=False), torch.nn.BatchNorm2d(h),
            torch.nn.Conv2d(h, h, 1, bias=False), torch.nn.BatchNorm2d(h), torch.nn.ReLU())

    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        y = torch.cat([a, self.branch(b)], 1)
        n, c, hh, ww = y.shape
        return y.view(n, 2, c // 2, hh, ww).transpose(1, 2).reshape(n, c, hh, ww)


class ShuffleNetish(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 24, 3, 2, 1), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, 1))
        stages, c = [], 24
        for out, n in ((116, 4), (232, 8), (464, 4)):
            stages += [torch.nn.Conv2d(c, out, 3, 2, 1, groups=1), torch.nn.ReLU()]
            stages += [ShuffleBlock(out) for _ in range(n - 1)]
            c = out
        self.stages = torch.nn.Sequential(*stages)
        self.head = torch.nn.Linear(c, 1000)

    def forward(self, x):
        return self.head(self.stages(self.stem(x)).mean((2, 3)))


class Fire(torch.nn.Module):
    def __init__(self, c, s, e):
        super().__init__()
        self.squeeze = torch.nn.Conv2d(c, s, 1)
        self.e1 = torch.nn.Conv2d(s, e, 1)
        self.e3 = torch.nn.Conv2d(s, e, 3, padding=1)

    def forward(self, x):
        s = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.e1(s)), torch.relu(self.e3(s))], 1)


class SqueezeNetish(torch.nn.Module):
    """SqueezeNet 1.1: fire modules, max pools, a 1x1 conv classifier and global average pooling."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 64, 3, 2), torch.nn.ReLU(), torch.nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(64, 16, 64), Fire(128, 16, 64), torch.nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(128, 32, 128), Fire(256, 32, 128), torch.nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256), Fire(512, 64, 256),
            torch.nn.Conv2d(512, 1000, 1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1))

    def forward(self, x):
        return self.net(x).flatten(1)


class InvertedResidualSE(torch.nn.Module):
    """MobileNetV3's block: 1x1 expand, hardswish, depthwise k x k, squeeze-and-excitation
    (hardsigmoid gate), 1x1 project, residual where shapes allow."""

    def __init__(self, c, e, out, k, stride):
        super().__init__()
        self.expand = torch.nn.Sequential(torch.nn.Conv2d(c, e, 1, bias=False), torch.nn.BatchNorm2d(e),
                                          torch.nn.Hardswish())
        self.dw = torch.nn.Sequential(torch.nn.Conv2d(e, e, k, stride, k // 2, groups=e, bias=False),
                                      torch.nn.BatchNorm2d(e), torch.nn.Hardswish())
        self.se = torch.nn.Sequential(torch.nn.AdaptiveAvgPool2d(1), torch.nn.Conv2d(e, e // 4, 1), torch.nn.ReLU(),
                                      torch.nn.Conv2d(e // 4, e, 1), torch.nn.Hardsigmoid())
        self.project = torch.nn.Sequential(torch.nn.Conv2d(e, out, 1, bias=False), torch.nn.BatchNorm2d(out))
        self.residual = stride == 1 and c == out

    def forward(self, x):
        y = self.dw(self.expand(x))
        y = self.project(y * self.se(y))
        return x + y if self.residual else y


class MobileNetV3ish(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, 2, 1, bias=False), torch.nn.BatchNorm2d(16),
                                        torch.nn.Hardswish())
        cfg = [(16, 64, 24, 3, 2), (24, 72, 24, 3, 1), (24, 72, 40, 5, 2), (40, 120, 40, 5, 1), (40, 240, 80, 3, 2),
               (80, 200, 80, 3, 1), (80, 480, 112, 3, 1), (112, 672, 160, 5, 2), (160, 960, 160, 5, 1)]
        self.blocks = torch.nn.Sequential(*[InvertedResidualSE(*c) for c in cfg])
        self.head = torch.nn.Sequential(torch.nn.Conv2d(160, 960, 1), torch.nn.Hardswish())
        self.fc = torch.nn.Linear(960, 1000)

    def forward(self, x):
        return self.fc(self.head(self.blocks(self.stem(x))).mean((2, 3)))


def _hand(cls):
    def build(batch=1):
        torch.manual_seed(0)
        return _bn_statistics(_he_init(cls())), (torch.randn(batch, 3, 224, 224),)
    return build


CNNS = {
    "ResNet-50": _hf("ResNetModel", "ResNetConfig"),
    "MobileNetV1": _hf("MobileNetV1Model", "MobileNetV1Config"),
    "MobileNetV2": _hf("MobileNetV2Model", "MobileNetV2Config"),
    "EfficientNet-B0": _hf("EfficientNetModel", "EfficientNetConfig", image_size=224, width_coefficient=1.0,
                           depth_coefficient=1.0, hidden_dim=1280),
    "ConvNeXt-T": _hf("ConvNextModel", "ConvNextConfig"),
    "RegNetY-4GF": _hf("RegNetModel", "RegNetConfig"),
    "ShuffleNetV2-ish": _hand(ShuffleNetish),
    "SqueezeNet-1.1": _hand(SqueezeNetish),
    "MobileNetV3-ish": _hand(MobileNetV3ish),
}

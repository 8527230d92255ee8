"""A wider vision set than issue 44's nine networks, for the worst model nobody tuned for: more
transformers configs (default sizes, random weights, batch norms given real statistics) and hand-written
ResNeXt-, DenseNet- and VGG-style nets, 224 px. `python -m benchmarks.cnn --set wide` (or `--set all`)."""
from __future__ import annotations

import torch

from benchmarks.cnn_models import _bn_statistics, _hand, _hf


class _PixelValues(torch.nn.Module):
    """A transformers vision model called on pixel_values, returning its last hidden state."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        out = self.m(pixel_values=x)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def _hf_wrapped(model_cls, config_cls, **cfg):
    def build(batch=1):
        import transformers as T
        torch.manual_seed(0)
        m = getattr(T, model_cls)(getattr(T, config_cls)(**cfg)).eval()
        return _bn_statistics(_PixelValues(m).eval()), (torch.randn(batch, 3, 224, 224),)
    return build


def _stem():
    """ResNet's: a 7x7 stride-2 conv to 64 channels, batch norm, ReLU, a 3x3 stride-2 max pool."""
    return [torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(64), torch.nn.ReLU(),
            torch.nn.MaxPool2d(3, 2, 1)]


class ResNeXtBlock(torch.nn.Module):
    """ResNeXt's bottleneck: 1x1, 3x3 in 32 groups, 1x1, a projection where the shape changes."""

    def __init__(self, cin, width, cout, stride, groups=32):
        super().__init__()
        bn = torch.nn.BatchNorm2d
        self.c1, self.b1 = torch.nn.Conv2d(cin, width, 1, bias=False), bn(width)
        self.c2, self.b2 = torch.nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False), bn(width)
        self.c3, self.b3 = torch.nn.Conv2d(width, cout, 1, bias=False), bn(cout)
        self.down = None if cin == cout and stride == 1 else torch.nn.Sequential(
            torch.nn.Conv2d(cin, cout, 1, stride, bias=False), bn(cout))

    def forward(self, x):
        r = x if self.down is None else self.down(x)
        y = torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))
        return torch.relu(self.b3(self.c3(y)) + r)


class ResNeXt50ish(torch.nn.Module):
    """ResNeXt-50 32x4d (torchvision's resnext50_32x4d): groups of 4, 8, 16 and 32 channels."""

    def __init__(self):
        super().__init__()
        layers = _stem()
        cin = 64
        for i, (n, width, cout) in enumerate([(3, 128, 256), (4, 256, 512), (6, 512, 1024), (3, 1024, 2048)]):
            for j in range(n):
                layers.append(ResNeXtBlock(cin, width, cout, 2 if j == 0 and i > 0 else 1))
                cin = cout
        self.features = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.features(x).mean((2, 3))


class DenseLayer(torch.nn.Module):
    def __init__(self, c, growth=32):
        super().__init__()
        self.n1, self.c1 = torch.nn.BatchNorm2d(c), torch.nn.Conv2d(c, 4 * growth, 1, bias=False)
        self.n2, self.c2 = torch.nn.BatchNorm2d(4 * growth), torch.nn.Conv2d(4 * growth, growth, 3, 1, 1, bias=False)

    def forward(self, x):
        return torch.cat([x, self.c2(torch.relu(self.n2(self.c1(torch.relu(self.n1(x))))))], 1)


class DenseNet121ish(torch.nn.Module):
    """DenseNet-121: pre-activation layers whose outputs are concatenated, transitions with average pools."""

    def __init__(self):
        super().__init__()
        layers = _stem()
        c = 64
        for i, n in enumerate([6, 12, 24, 16]):
            for _ in range(n):
                layers.append(DenseLayer(c))
                c += 32
            if i < 3:
                layers += [torch.nn.BatchNorm2d(c), torch.nn.ReLU(), torch.nn.Conv2d(c, c // 2, 1, bias=False),
                           torch.nn.AvgPool2d(2)]
                c //= 2
        self.features = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.features(x).mean((2, 3))


class VGG11ish(torch.nn.Module):
    """VGG-11 with its classifier: adaptive_avg_pool2d(7) on a 7x7 map, a 25088 x 4096 linear layer."""

    def __init__(self):
        super().__init__()
        layers, c = [], 3
        for v in [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]:
            if v == "M":
                layers.append(torch.nn.MaxPool2d(2))
            else:
                layers += [torch.nn.Conv2d(c, v, 3, 1, 1), torch.nn.ReLU()]
                c = v
        self.net = torch.nn.Sequential(*layers, torch.nn.AdaptiveAvgPool2d(7), torch.nn.Flatten(),
                                       torch.nn.Linear(512 * 49, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1000))

    def forward(self, x):
        return self.net(x)


WIDE_CNNS = {
    "ResNet-18": _hf("ResNetModel", "ResNetConfig", layer_type="basic", depths=[2, 2, 2, 2],
                     hidden_sizes=[64, 128, 256, 512]),
    "RegNetX": _hf("RegNetModel", "RegNetConfig", layer_type="x"),
    "BiT": _hf_wrapped("BitModel", "BitConfig"),
    "ConvNeXtV2-T": _hf_wrapped("ConvNextV2Model", "ConvNextV2Config"),
    "MobileViT-S": _hf_wrapped("MobileViTModel", "MobileViTConfig", image_size=224),
    "Swin-T": _hf_wrapped("SwinModel", "SwinConfig"),
    "ViT-S/16": _hf_wrapped("ViTModel", "ViTConfig", hidden_size=384, num_attention_heads=6, intermediate_size=1536),
    "PoolFormer-S12": _hf_wrapped("PoolFormerModel", "PoolFormerConfig"),
    "LeViT": _hf_wrapped("LevitModel", "LevitConfig"),
    "ResNeXt-50-ish": _hand(ResNeXt50ish),
    "DenseNet-121-ish": _hand(DenseNet121ish),
    "VGG-11-ish": _hand(VGG11ish),
}


def with_vision_set(issue_table: dict) -> tuple[dict, dict]:
    """(every workload, {"issue", "vision", "all": names}): a benchmark's own table and the vision networks
    of issue 44's set and this one that the table does not already hold (benchmarks.bf16 and int8_cnn's --set)."""
    from benchmarks.cnn_models import CNNS
    vision = {name: build for name, build in {**CNNS, **WIDE_CNNS}.items() if name not in issue_table}
    workloads = {**issue_table, **vision}
    return workloads, {"issue": list(issue_table), "vision": list(vision), "all": list(workloads)}

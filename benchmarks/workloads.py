"""The benchmark workloads of issue "Fast CPU kernels and fusion" (random weights unless noted)."""
from __future__ import annotations

import torch


class MLP(torch.nn.Module):
    """4 x (Linear(1024) + GELU)."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(1024, 1024), torch.nn.GELU())])

    def forward(self, x):
        return self.layers(x)


def mlp(batch):
    def build():
        torch.manual_seed(0)
        return MLP().eval(), (torch.randn(batch, 1024),)
    return build


def resnet50():
    import transformers as T
    torch.manual_seed(0)
    return T.ResNetModel(T.ResNetConfig()).eval(), (torch.randn(1, 3, 224, 224),)


def bert_base():
    import transformers as T
    torch.manual_seed(0)
    m = T.BertModel(T.BertConfig()).eval()
    ids = torch.randint(0, 30000, (1, 128), generator=torch.Generator().manual_seed(0))
    return m, (ids, torch.ones_like(ids))


def minilm(batch):
    def build():
        import transformers as T

        from tests.models import minilm_path
        path = minilm_path()
        m = T.AutoModel.from_pretrained(path).eval()
        tok = T.AutoTokenizer.from_pretrained(path)
        texts = [f"sentence number {i} about ahead-of-time compilation of neural networks" for i in range(batch)]
        enc = tok(texts, padding="max_length", max_length=128, truncation=True, return_tensors="pt")
        return m, (enc["input_ids"], enc["attention_mask"])
    return build


WORKLOADS = {
    "MLP b1": mlp(1), "MLP b64": mlp(64), "ResNet-50": resnet50, "BERT-base s128": bert_base,
    "MiniLM b1 s128": minilm(1), "MiniLM b32 s128": minilm(32),
}

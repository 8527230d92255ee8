"""What Hugging Face users pass, against transformers itself: batched left-padded input_ids with an
attention mask (vs model.generate), the text-generation pipeline (vs transformers' pipeline), and
cuvil's server mounted inside an existing FastAPI app."""
import numpy as np
import pytest
import torch

import cuvil
import cuvil.llm

from .llm_fixtures import checkpoint


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("bridges") / "ckpt"
    model = checkpoint(d)
    return model, d, cuvil.llm.from_transformers(d, max_seq_len=64)


def test_batched_left_padded_input_ids_match_transformers_generate(pair):
    model, _, llm = pair
    rows = [[5, 17, 33, 2, 99, 14], [71, 8, 41], [9, 10, 11, 12]]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        ref = model.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=0,
                             eos_token_id=None)[:, width:].tolist()
    assert llm.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10) == ref
    assert llm.generate(input_ids=np.array(rows[0]), max_new_tokens=10) == [ref[0]]
    with pytest.raises(cuvil.ShapeError, match="one run of 1s"):
        llm.generate(input_ids=ids, attention_mask=torch.tensor([[1, 0, 1, 1, 1, 1]] * 3), max_new_tokens=2)
    with pytest.raises(TypeError, match="input_ids replaces prompt"):
        llm.generate("x", input_ids=ids)


def test_text_generation_pipeline_matches_transformers(pair):
    import transformers as T
    model, d, llm = pair
    hf = T.pipeline("text-generation", model=model, tokenizer=T.AutoTokenizer.from_pretrained(str(d)), device="cpu")
    pipe = cuvil.llm.pipeline("text-generation", model=llm)
    texts = ["cuvil compiles", "le café est"]
    for kw in ({}, {"return_full_text": False}):
        want = hf(texts, max_new_tokens=8, do_sample=False, **kw)
        assert pipe(texts, max_new_tokens=8, **kw) == want
        assert pipe(texts[0], max_new_tokens=8, **kw) == want[0]


def test_cuvil_app_mounted_in_an_existing_fastapi_app(tmp_path):
    """The README's integration example: an app of your own with cuvil's served under a prefix."""
    httpx = pytest.importorskip("httpx", reason="the tests' HTTP client (a dev requirement)")
    from fastapi import FastAPI

    from cuvil.serve.http import create_app

    from .test_serve import _server
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 2).eval()
    cuvil.compile(m, (torch.randn(1, 4),)).save(tmp_path / "lin.cuvil")
    app = FastAPI()

    @app.get("/hello")
    def hello():
        return {"hello": "world"}
    app.mount("/models", create_app(tmp_path / "lin.cuvil"))
    x = [[0.5, -1.0, 2.0, 0.25]]
    with _server(app) as url, httpx.Client(base_url=url, timeout=30) as c:
        assert c.get("/hello").json() == {"hello": "world"}
        r = c.post("/models/v2/models/lin/infer",
                   json={"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": x[0]}]})
        assert r.status_code == 200, r.text
    with torch.no_grad():
        want = m(torch.tensor(x)).numpy()
    np.testing.assert_allclose(np.array(r.json()["outputs"][0]["data"]).reshape(1, 2), want, rtol=1e-5, atol=1e-5)

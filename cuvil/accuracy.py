"""The accuracy contract of the lossy precisions (DESIGN "Accuracy contract"): a model compiled in
bf16, fp16 or int8 is run beside its source model (fp32) on the example inputs and any calibration
inputs, and the error is measured per output:

  max_abs   largest |compiled - source| over every element of every input
  scale     largest |source|
  rel       max_abs / scale: the error at the output's own scale (verify checks this)
  cosine    the worst cosine similarity of one row (last axis) against the source's
  mean_cosine  the mean over the rows (a padded position's garbage row can be the worst one)
  top1      for [batch, classes] outputs: the share of rows whose argmax agrees (None otherwise)
  mismatch  for integer and bool outputs (labels, indices): the share of elements that differ; verify
            allows at most rtol of them (None for float outputs)

verify=True then checks max_abs <= atol + rtol * largest |source| per output: a scale-aware bound,
since elementwise relative error means little near zero for a quantized model. rtol / atol left
unset take the precision's defaults (TOLERANCE)."""
from __future__ import annotations

import numpy as np

# precision -> (rtol, atol) that verify=True uses when the caller gives none; fp32 is elementwise
# (np.allclose), the lossy ones scale-aware as above. Chosen from the test zoo and MiniLM / BERT:
# their worst rel was 1/4 to 1/10 of these.
TOLERANCE = {"fp32": (1e-4, 1e-4), "fp16": (5e-3, 1e-4), "bf16": (2e-2, 1e-4), "int8": (5e-2, 1e-4)}


def _rows(a):
    a = np.asarray(a, np.float64)
    return a.reshape(-1, a.shape[-1]) if a.ndim >= 1 and a.size else a.reshape(1, -1)


def measure(pairs) -> dict:
    """pairs: [(source outputs, compiled outputs)] per input -> {"inputs": n, "outputs": [metrics]}."""
    outputs = []
    for i in range(len(pairs[0][0]) if pairs else 0):
        max_abs = scale = 0.0
        cosine, cos_sum, agree, rows, classifier = 1.0, 0.0, 0, 0, True
        differ = counted = 0
        for expected, got in pairs:
            e, g = np.asarray(expected[i]), np.asarray(got[i])
            if e.dtype.kind == "c":                    # complex: its (real, imaginary) pairs
                e, g = (np.stack([np.real(x), np.imag(x)], -1) for x in (e, g))
            if e.size == 0:
                continue
            if e.dtype.kind not in "fc":               # labels / indices: how many differ
                classifier = False
                differ += int((e != g).sum()) if e.shape == g.shape else e.size
                counted += e.size
                continue
            e64, g64 = e.astype(np.float64), g.astype(np.float64)
            max_abs = max(max_abs, float(np.abs(e64 - g64).max()))
            scale = max(scale, float(np.abs(e64).max()))
            er, gr = _rows(e64), _rows(g64)
            norms = np.linalg.norm(er, axis=1) * np.linalg.norm(gr, axis=1)
            cos = np.where(norms > 0, (er * gr).sum(axis=1) / np.where(norms > 0, norms, 1.0), 1.0)
            cosine = min(cosine, float(cos.min()))
            cos_sum += float(cos.sum())
            classifier = classifier and e.ndim == 2 and e.shape[1] > 1
            agree += int((er.argmax(axis=1) == gr.argmax(axis=1)).sum())
            rows += er.shape[0]
        outputs.append({"max_abs": max_abs, "scale": scale, "rel": max_abs / scale if scale > 0 else max_abs,
                        "cosine": cosine, "mean_cosine": cos_sum / rows if rows else 1.0,
                        "top1": agree / rows if classifier and rows else None,
                        "mismatch": differ / counted if counted else None})
    return {"inputs": len(pairs), "outputs": outputs}


def failures(acc: dict, rtol: float, atol: float) -> dict:
    """{output: (max_abs, rel)} of the float outputs past max_abs <= atol + rtol * scale, and
    {output: (mismatch, mismatch)} of the integer ones where more than rtol of the elements differ."""
    bad = {}
    for i, o in enumerate(acc["outputs"]):
        if o.get("mismatch") is not None:
            if o["mismatch"] > rtol:
                bad[i] = (o["mismatch"], o["mismatch"])
        elif not o["max_abs"] <= atol + rtol * o["scale"]:
            bad[i] = (o["max_abs"], o["rel"])
    return bad


def describe(acc: dict, precision: str) -> str:
    """One line per output for --verbose and cuvil inspect."""
    lines = [f"{precision} against fp32 on {acc['inputs']} input(s):"]
    for i, o in enumerate(acc["outputs"]):
        if o.get("mismatch") is not None:
            lines.append(f"  output {i}: {100 * o['mismatch']:.2f}% of its (integer) elements differ")
            continue
        top1 = f", top-1 agreement {100 * o['top1']:.1f}%" if o.get("top1") is not None else ""
        lines.append(f"  output {i}: max abs err {o['max_abs']:.3g}, rel {o['rel']:.3g}, "
                     f"row cosine worst {o['cosine']:.6f} mean {o['mean_cosine']:.6f}{top1}")
    return "\n".join(lines)

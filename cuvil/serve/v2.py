"""The KServe / Triton v2 inference protocol's tensors: request bodies (JSON, or one .npy array) to
numpy arrays checked against the artifact's inputs, and outputs back to JSON. A body is untrusted:
every fault is a ProtocolError naming it (the server answers 400), never an exception of numpy's
or json's reaching the client."""
from __future__ import annotations

import io
import json
import math

import numpy as np

# v2 datatype name -> numpy dtype name
DATATYPES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
             "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
             "FP32": "float32", "FP64": "float64"}
V2_NAME = {v: k for k, v in DATATYPES.items()}
# elements one request may carry (a JSON body of this many numbers is already hundreds of MiB)
MAX_ELEMENTS = 1 << 26
MAX_RANK = 16


class ProtocolError(ValueError):
    """A request the protocol or the model cannot take (HTTP 400, or `status`)."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


def tensor_metadata(spec) -> dict:
    shape = [d if isinstance(d, int) else -1 for d in spec["shape"]]
    return {"name": spec["name"], "datatype": V2_NAME.get(spec["dtype"], spec["dtype"].upper()), "shape": shape}


def model_metadata(name, module) -> dict:
    return {"name": name, "versions": ["1"], "platform": "cuvil",
            "inputs": [tensor_metadata(s) for s in module.inputs],
            "outputs": [tensor_metadata(s) for s in module.outputs]}


def _shape(value, where):
    if not isinstance(value, list) or len(value) > MAX_RANK or \
            not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_ELEMENTS for d in value):
        raise ProtocolError(f"{where}: shape must be a list of at most {MAX_RANK} ints in [0, {MAX_ELEMENTS}], "
                            f"got {_short(value)}")
    if math.prod(value) > MAX_ELEMENTS:
        raise ProtocolError(f"{where}: shape {value} holds more than {MAX_ELEMENTS} elements")
    return value


def _short(value, n=80):
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= n else text[:n] + "..."


def _tensor(item, spec, where):
    """One request input: its data as an array of the input's dtype and the given shape."""
    want = spec["dtype"]
    datatype = item.get("datatype")
    if datatype not in DATATYPES:
        raise ProtocolError(f"{where}: datatype must be one of {', '.join(DATATYPES)}, got {_short(datatype)}")
    if DATATYPES[datatype] != want:
        raise ProtocolError(f"{where}: expected datatype {V2_NAME.get(want, want)}, got {datatype}")
    shape = _shape(item.get("shape"), where)
    data = item.get("data")
    if not isinstance(data, list):
        raise ProtocolError(f"{where}: data must be a list (flat or nested), got {type(data).__name__}")
    try:
        values = np.asarray(data)
    except (ValueError, TypeError, OverflowError) as e:         # ragged nesting, huge ints
        raise ProtocolError(f"{where}: data is not a rectangular list of numbers ({e})") from None
    kind, target = values.dtype.kind, np.dtype(want)
    allowed, what = {"b": ("b", "booleans"), "i": ("biu", "integers"), "u": ("biu", "integers")}.get(
        target.kind, ("biuf", "numbers"))
    if values.size and kind not in allowed:
        raise ProtocolError(f"{where}: data must be {what} for {datatype}, got {values.dtype.name} values")
    if values.size != math.prod(shape):
        raise ProtocolError(f"{where}: shape {shape} holds {math.prod(shape)} elements, data has {values.size}")
    if target.kind in "iu" and values.size:
        info = np.iinfo(target)
        if values.min() < info.min or values.max() > info.max:
            raise ProtocolError(f"{where}: values outside {datatype}'s range [{info.min}, {info.max}]")
    return values.astype(target).reshape(shape)


def decode_request(body: bytes, module):
    """(request id or None, {input name: array}, output names asked for or None)."""
    try:
        req = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ProtocolError(f"the body is not JSON ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(req, dict) or not isinstance(req.get("inputs"), list):
        raise ProtocolError('the body must be a JSON object with an "inputs" list')
    specs = {s["name"]: s for s in module.inputs}
    arrays = {}
    for n, item in enumerate(req["inputs"]):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise ProtocolError(f"inputs[{n}] must be an object with a string name")
        name = item["name"]
        if name not in specs:
            raise ProtocolError(f"inputs[{n}]: unknown input {_short(name)}; the model takes {list(specs)}")
        if name in arrays:
            raise ProtocolError(f"inputs[{n}]: input {name!r} given twice")
        arrays[name] = _tensor(item, specs[name], f"input {name!r}")
    if missing := [s for s in specs if s not in arrays]:
        raise ProtocolError(f"missing inputs {missing}")
    rid = req.get("id")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError(f"id must be a string, got {_short(rid)}")
    return rid, arrays, _output_names(req.get("outputs"), module)


def _output_names(asked, module):
    if asked is None:
        return None
    names = [o["name"] for o in module.outputs]
    if not isinstance(asked, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in asked):
        raise ProtocolError('outputs must be a list of objects with a string "name"')
    unknown = [o["name"] for o in asked if o["name"] not in names]
    if unknown:
        raise ProtocolError(f"unknown outputs {[_short(u) for u in unknown]}; the model gives {names}")
    return [o["name"] for o in asked]


def encode_response(model_name, rid, module, outputs, asked=None) -> dict:
    specs = module.outputs
    wanted = asked or [s["name"] for s in specs]
    by_name = {s["name"]: a for s, a in zip(specs, outputs)}
    body = {"model_name": model_name, "model_version": "1",
            "outputs": [{"name": n, "datatype": V2_NAME.get(by_name[n].dtype.name, by_name[n].dtype.name.upper()),
                         "shape": list(by_name[n].shape), "data": by_name[n].ravel().tolist()} for n in wanted]}
    if rid is not None:
        body["id"] = rid
    return body


def decode_npy(body: bytes, module) -> dict:
    """A one-input model's input as a .npy body (no pickles)."""
    if len(module.inputs) != 1:
        raise ProtocolError(f"a .npy body carries one array; this model takes {len(module.inputs)} inputs "
                            f"({', '.join(i['name'] for i in module.inputs)}): send JSON")
    try:
        a = np.load(io.BytesIO(body), allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - whatever numpy makes of hostile bytes
        raise ProtocolError(f"the body is not a .npy array ({type(e).__name__}: {str(e)[:80]})") from None
    if not isinstance(a, np.ndarray) or a.size > MAX_ELEMENTS:
        raise ProtocolError(f"the .npy body must hold one array of at most {MAX_ELEMENTS} elements")
    return {module.inputs[0]["name"]: a}


def encode_npy(array) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()

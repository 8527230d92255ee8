"""Plain Python control flow on tensor values, made exportable: when torch.export stops at a
data-dependent guard (`if x.sum() > 0:`, `while (x > t).any():`), forward's source is rewritten,
statement by statement, so that

    if T: A  else: B        ->  (v, w) = _cuvil_if(T, _then, _else, (v, w))      # A and B as functions
    if T: ...return a  else: ...return b   ->   return _cuvil_if(T, _then, _else, (...))
    while T: A              ->  (v, w) = _cuvil_while(_cond, _body, (v, w))

where _cuvil_if / _cuvil_while (cuvil_if, cuvil_while below) call torch.cond / torch.while_loop when the condition is a tensor and
run the Python statement otherwise (a test on a flag or a shape keeps its meaning). The rest of the
function's code stays as written (same file and line numbers, so errors point at the user's source).
What cannot be rewritten (an early return in one branch, break/continue, a variable set in one
branch only) is reported with its line and the rewrite it would need."""
from __future__ import annotations

import ast
import inspect
import textwrap
import types

import torch

from ..errors import CuvilError, UnsupportedOpError


def cuvil_if(pred, then_fn, else_fn, operands):
    if isinstance(pred, torch.Tensor):
        return torch.cond(pred, then_fn, else_fn, tuple(operands))
    return then_fn(*operands) if pred else else_fn(*operands)


def cuvil_while(cond_fn, body_fn, carried):
    first = cond_fn(*carried)
    if isinstance(first, torch.Tensor):
        return torch.while_loop(cond_fn, body_fn, tuple(carried))
    go = first
    while go:
        carried = body_fn(*carried)
        go = cond_fn(*carried)
    return carried


DATA_DEPENDENT = ("GuardOnDataDependentSymNode", "data-dependent", "data dependent")


def is_data_dependent(error: BaseException) -> bool:
    text = f"{error} {error.__cause__ or ''}"
    return any(s in text for s in DATA_DEPENDENT)


def _stored(nodes) -> set:
    """Names a block assigns (not inside nested functions, lambdas or comprehensions; a nested
    function's own name, as an inner rewrite's branch functions, is not a value the branch returns)."""
    out = set()

    def walk(n):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp,
                          ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        for c in ast.iter_child_nodes(n):
            walk(c)
    for n in nodes:
        walk(n)
    return out


def _has(nodes, kinds) -> bool:
    """Whether the block holds a statement of these kinds outside nested functions (the branch
    functions of an inner rewrite return; a loop's own break/continue inside a nested loop counts:
    rewriting would move it out of its loop)."""
    for n in nodes:
        if isinstance(n, kinds):
            return True
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if _has(list(ast.iter_child_nodes(n)), kinds):
            return True
    return False


def _returns_at_end(body) -> bool:
    return bool(body) and isinstance(body[-1], ast.Return) and not _has(body[:-1], ast.Return)


class _Rewriter:
    def __init__(self, where):
        self.where, self.count, self.rewritten, self.notes = where, 0, 0, []

    def note(self, node, what):
        self.notes.append((f"{what}", f"{self.where[0]}:{self.where[1] + node.lineno - 1}"))

    def block(self, stmts, defined: set) -> list:
        out = []
        for s in stmts:
            out += self.statement(s, defined)
            defined |= _stored([s])
        return out

    def statement(self, s, defined):
        if isinstance(s, ast.If):
            return self._if(s, set(defined))
        if isinstance(s, ast.While):
            return self._while(s, set(defined))
        for field in ("body", "orelse", "finalbody"):         # for/with/try blocks: their own statements
            if isinstance(getattr(s, field, None), list) and not isinstance(s, (ast.FunctionDef, ast.ClassDef)):
                setattr(s, field, self.block(getattr(s, field), set(defined)))
        return [s]

    def _fn(self, name, params, body, ret, lineno):
        args = ast.arguments(posonlyargs=[], args=[ast.arg(p) for p in params], kwonlyargs=[], kw_defaults=[],
                             defaults=[])
        tail = [ast.Return(ret)] if ret is not None else []
        return ast.FunctionDef(name, args, body + tail or [ast.Pass()], [], None, lineno=lineno)

    def _names(self, names):
        return ast.Tuple([ast.Name(n, ast.Load()) for n in names], ast.Load())

    def _if(self, s, defined):
        s.body = self.block(s.body, set(defined))
        s.orelse = self.block(s.orelse, set(defined))
        k = self.count
        if _has(s.body + s.orelse, (ast.Break, ast.Continue, ast.Yield, ast.Global, ast.Nonlocal)):
            self.note(s, "if on a tensor with break/continue/yield in a branch: move them out, or write torch.cond")
            return [s]
        returns = _returns_at_end(s.body) and _returns_at_end(s.orelse)
        if not returns and _has(s.body + s.orelse, ast.Return):
            self.note(s, "if on a tensor that returns in one branch only: end both branches with a return, or "
                         "assign the result in both (out = ...) and return it after the if")
            return [s]
        stored = _stored(s.body) | _stored(s.orelse)
        params = sorted(stored & defined)
        if returns:
            outs, ret = None, None
        else:
            outs = sorted(n for n in stored if n in defined or (n in _stored(s.body) and n in _stored(s.orelse)))
            only_one = sorted(stored - set(outs))
            if only_one or not outs:
                self.note(s, f"if on a tensor that sets {', '.join(only_one)} in one branch only: set it before the if"
                          if only_one else "if on a tensor whose branches assign nothing: torch.cond needs results")
                return [s]
            ret = self._names(outs)
        self.count += 1
        then_fn = self._fn(f"_cuvil_then_{k}", params, s.body, ret, s.lineno)
        else_fn = self._fn(f"_cuvil_else_{k}", params, s.orelse, ret, s.lineno)
        call = ast.Call(ast.Name("_cuvil_if", ast.Load()), [s.test, ast.Name(then_fn.name, ast.Load()),
                                                             ast.Name(else_fn.name, ast.Load()), self._names(params)], [])
        self.rewritten += 1
        if returns:
            return [then_fn, else_fn, ast.Return(call, lineno=s.lineno)]
        target = ast.Tuple([ast.Name(n, ast.Store()) for n in outs], ast.Store())
        return [then_fn, else_fn, ast.Assign([target], call, lineno=s.lineno)]

    def _while(self, s, defined):
        s.body = self.block(s.body, set(defined))
        if s.orelse or _has(s.body, (ast.Break, ast.Continue, ast.Return, ast.Yield, ast.Global, ast.Nonlocal)):
            self.note(s, "while on a tensor with else/break/continue/return: write torch.while_loop(cond_fn, "
                         "body_fn, carried) with the loop's state as carried values")
            return [s]
        carried = sorted(_stored(s.body) & defined)
        if not carried:
            self.note(s, "while on a tensor whose body changes no variable set before the loop")
            return [s]
        k = self.count
        self.count += 1
        cond_fn = self._fn(f"_cuvil_cond_{k}", carried, [], s.test, s.lineno)
        body_fn = self._fn(f"_cuvil_body_{k}", carried, s.body, self._names(carried), s.lineno)
        call = ast.Call(ast.Name("_cuvil_while", ast.Load()), [ast.Name(cond_fn.name, ast.Load()),
                                                                ast.Name(body_fn.name, ast.Load()), self._names(carried)], [])
        self.rewritten += 1
        target = ast.Tuple([ast.Name(n, ast.Store()) for n in carried], ast.Store())
        return [cond_fn, body_fn, ast.Assign([target], call, lineno=s.lineno)]


def rewrite_forward(model):
    """forward of `model` with its tensor if/while statements rewritten, bound to the model; and the
    notes on what could not be rewritten [(what, file:line)]."""
    fn = type(model).forward
    try:
        lines, start = inspect.getsourcelines(fn)
        path = inspect.getsourcefile(fn) or "<forward>"
    except (OSError, TypeError) as e:
        raise CuvilError(f"cannot read the source of {type(model).__name__}.forward to rewrite its control flow "
                         f"({e})") from None
    if fn.__code__.co_freevars:
        raise CuvilError(f"{type(model).__name__}.forward uses closure variables "
                         f"({', '.join(fn.__code__.co_freevars)}): its control flow cannot be rewritten")
    tree = ast.parse(textwrap.dedent("".join(lines)))
    fdef = tree.body[0]
    fdef.decorator_list = []
    rw = _Rewriter((path, start))
    params = {a.arg for a in fdef.args.posonlyargs + fdef.args.args + fdef.args.kwonlyargs}
    params |= {a.arg for a in (fdef.args.vararg, fdef.args.kwarg) if a is not None}
    fdef.body = rw.block(fdef.body, params)
    ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, start - 1)
    # in the module's own globals (torch.cond's tracer looks names up through the module), with the two
    # helpers added under names of their own; the new function lands in `local`, not in the module
    module_globals = fn.__globals__
    module_globals.setdefault("_cuvil_if", cuvil_if)
    module_globals.setdefault("_cuvil_while", cuvil_while)
    local = {}
    exec(compile(tree, path, "exec"), module_globals, local)     # noqa: S102 - the user's own forward, rewritten
    return types.MethodType(local[fdef.name], model), rw


def export_rewritten(model, export, error):
    """Export again with forward rewritten (`export(model)` exports), after `error` from the first
    try. UnsupportedOpError when nothing could be rewritten or the export still fails."""
    new_forward, rw = rewrite_forward(model)
    if not rw.rewritten:
        raise UnsupportedOpError(rw.notes or [(f"control flow on tensor values that cuvil cannot rewrite ({error})",
                                               None)]) from error
    model.forward = new_forward
    try:
        return export(model)
    except CuvilError as e:
        notes = rw.notes + [(f"after rewriting {rw.rewritten} if/while statement(s) into torch.cond / "
                             f"torch.while_loop, torch.export still failed: {str(e)[:1500]}", None)]
        raise UnsupportedOpError(notes) from e
    finally:
        del model.forward

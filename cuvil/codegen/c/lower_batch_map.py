"""batch_map (passes/batch_map.py) in C: its body, the network's prefix at batch 1, run image by image.

The body is one outlined task over "slots": each slot is an arena of its own for one image at a time
(a table of the image's input and output pointers, then the body's memory plan), and takes the next
image from a shared counter until the phase's last. First the images that divide among the threads:
every thread runs a slot of its own and whole images on its core (an image's maps stay in that core's
L2, the kernels run single-threaded: no join per layer); then the rest (3 images on 2 threads: the
third), and every image on one thread, in slot 0 one at a time with all the threads inside each
layer, as the batch-1 network runs.

The node's scratch: a header (the next image, the threads inside the body, a failure flag, the
phase's end, and the failure's message: a lowering's CUVIL_FAIL, such as out of memory for bf16
activations, ends the task and the caller fails with it), then SLOTS_MAX slots (fewer for a smaller
batch). Inside the task `A` is the slot's arena and the body's parallel loops get a context whose A is
the slot's, so every pointer the body's lowerings write stays relative to `A`."""
from __future__ import annotations

from ...ir import dims as D
from . import cstr
from .emit import lowering
from .lower_control import ALIGN, align, region_body, scratch_base

SLOTS_MAX = 8         # images run side by side at most (one per thread): the memory of 8 batch-1 plans
MESSAGE = 512         # bytes of a failure's message (as cuvil_err's)
HEADER = ALIGN + MESSAGE
# the header's int64 words: the next image, threads inside the body, failed, the phase's end
NEXT, THREADS, FAILED, END = (f"bm_[{i}]" for i in range(4))


def _layout(node, bounds):
    """(the body's memory plan, slots, bytes of a slot's pointer table, bytes of a slot) of a batch_map
    node; a dynamic batch takes the slots of its largest."""
    from . import C_BACKEND          # (the package registers this module: import it when used)
    from ...passes.pipeline import plan_memory
    body = node.attrs["body_graph"]
    plan = plan_memory(body, C_BACKEND)
    table = align(8 * (len(body.inputs) + len(body.outputs)))
    slots = min(D.upper_bound(node.inputs[0].type.shape[0], bounds), SLOTS_MAX)
    return plan, slots, table, align(table + plan.arena_bytes)


def _scratch(node, bounds):
    _, slots, _, slot_bytes = _layout(node, bounds)
    return HEADER + slots * slot_bytes


def _image_elems(v) -> str:
    return D.to_c(D.numel(v.type.shape[1:]))


@lowering("batch_map", scratch=_scratch)
def _batch_map(em, node):
    body = node.attrs["body_graph"]
    plan, slots, table, slot_bytes = _layout(node, em.graph.symbols)
    images = D.to_c(node.inputs[0].type.shape[0])
    base = scratch_base(em)
    vals = list(node.inputs) + list(node.outputs)
    consts = ["const "] * len(node.inputs) + [""] * len(node.outputs)
    ptr_in_table = [f"(({c}{em.ctype(v)} *)((void *const *)A)[{k}])" for k, (v, c) in enumerate(zip(vals, consts))]
    lines = region_body(em, body, plan, table, ptr_in_table[:len(node.inputs)], ptr_in_table[len(node.inputs):])
    name = f"cuvil_task_{len(em.tasks)}"
    outer = [f"  {c}{em.ctype(v)} *const bm{k}_ = {em.ptr(v)};" for k, (v, c) in enumerate(zip(vals, consts))]
    fill = [f"        ((const void **)A)[{k}] = bm{k}_ + img_ * {_image_elems(v)};" for k, v in enumerate(vals)]
    em.tasks.append("\n".join([
        '#pragma push_macro("CUVIL_FAIL")',
        "#undef CUVIL_FAIL",
        f"#define CUVIL_FAIL(...) do {{ if (!__atomic_exchange_n(&{FAILED}, 1, __ATOMIC_RELAXED)) "
        f"snprintf(bm_msg_, {MESSAGE}, __VA_ARGS__); return; }} while (0)",
        f"static void {name}(void *vctx, int64_t lo_, int64_t hi_) {{",
        "  CUVIL_LOCALS((const cuvil_ctx *)vctx)",
        f"  int64_t *const bm_ = (int64_t *)(A + {base});",
        f"  char *const bm_msg_ = A + {base + ALIGN};",
        *outer,
        "  for (int64_t slot_ = lo_; slot_ < hi_; slot_++) {",
        f"    char *const slot_a_ = A + {base + HEADER} + slot_ * (int64_t){slot_bytes};",
        "    cuvil_ctx cuvil_ctx_ = *(const cuvil_ctx *)vctx; cuvil_ctx_.A = slot_a_;",
        f"    {{ char *A = slot_a_; const int NT = (int){THREADS}; (void)A; (void)NT;",
        f"      for (int64_t img_; (img_ = __atomic_fetch_add(&{NEXT}, 1, __ATOMIC_RELAXED)) < {END};) {{",
        *fill,
        *("      " + ln for ln in lines),
        "      }",
        "    }",
        "  }",
        "}",
        '#pragma pop_macro("CUVIL_FAIL")']))
    return [f"/* {cstr.comment(images)} images, one at a time or one a thread in up to {slots} slots */",
            "{",
            f"  int64_t *const bm_ = (int64_t *)(A + {base});",
            f"  const int slots_ = NT < {slots} ? NT : {slots};",
            f"  const int64_t side_ = slots_ > 1 ? {images} / slots_ * slots_ : 0;",
            f"  {FAILED} = 0;",
            f"  if (side_) {{ {NEXT} = 0; {THREADS} = 1; {END} = side_; "
            f"cuvil_parallel_for(slots_, slots_, 1, {name}, (void *)&cuvil_ctx_); }}",
            f"  if (side_ < {images} && !{FAILED}) {{ {NEXT} = side_; {THREADS} = NT; {END} = {images}; "
            f"{name}((void *)&cuvil_ctx_, 0, 1); }}",
            f"  if ({FAILED}) CUVIL_FAIL(\"%s\", A + {base + ALIGN});",
            "}"]

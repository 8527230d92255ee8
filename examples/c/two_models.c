/* Two cuvil models in one C program, no Python and no files: each was compiled with its own name
 * (its own symbol prefix) into a library with its weights embedded:
 *
 *   cuvil compile encoder.py::Encoder --example-input float32[1,16] --name encoder -o libencoder.a
 *   cuvil compile head.py::Head --example-input float32[1,8] --name head -o libhead.a
 *   cc two_models.c libencoder.a libhead.a -lm -pthread -o two_models
 *
 * The encoder's output feeds the head; the program prints the head's outputs, one per line. */
#include <stdio.h>
#include <stdlib.h>

#include "libencoder.h"
#include "libhead.h"

int main(void) {
    cuvil_model *enc = cuvil_encoder_create_embedded(1), *head = cuvil_head_create_embedded(1);
    if (!enc || !head) {
        fprintf(stderr, "create failed: %s%s\n", cuvil_encoder_last_error(), cuvil_head_last_error());
        return 1;
    }
    float x[16], h[8], y[4];
    for (int i = 0; i < 16; i++) x[i] = (float)i / 16.0f - 0.5f;
    int64_t x_shape[2] = {1, 16}, h_shape[2] = {1, 8};
    const void *enc_in[1] = {x}, *head_in[1] = {h};
    const int64_t *enc_shapes[1] = {x_shape}, *head_shapes[1] = {h_shape};
    void *enc_out[1] = {h}, *head_out[1] = {y};
    /* the arenas: scratch memory of the sizes each model asks for, 64-byte aligned */
    void *enc_arena = aligned_alloc(64, (size_t)cuvil_encoder_arena_size() + 64);
    void *head_arena = aligned_alloc(64, (size_t)cuvil_head_arena_size() + 64);
    if (cuvil_encoder_run(enc, enc_in, enc_shapes, enc_out, enc_arena) ||
        cuvil_head_run(head, head_in, head_shapes, head_out, head_arena)) {
        fprintf(stderr, "run failed: %s%s\n", cuvil_encoder_last_error(), cuvil_head_last_error());
        return 1;
    }
    for (int i = 0; i < 4; i++) printf("%.7g\n", y[i]);
    cuvil_encoder_destroy(enc);
    cuvil_head_destroy(head);
    free(enc_arena);
    free(head_arena);
    return 0;
}

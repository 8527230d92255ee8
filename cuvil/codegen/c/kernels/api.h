/* The cuvil kernel library, as seen by generated model code. */
#ifndef CUVIL_KERNELS_API_H
#define CUVIL_KERNELS_API_H
#include "common.h"
#include "pool.h"
#include "gemm.h"
#include "qgemm.h"
#include "bf16dot.h"
#include "conv.h"
#include "winograd.h"
#include "blocked.h"
#include "norm.h"
#include "attention.h"
#include "llm.h"
#include "lowp.h"
#include "linalg.h"
#endif

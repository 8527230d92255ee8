"""C types of IR dtypes."""
CTYPE = {"float32": "float", "float64": "double", "float16": "_Float16", "int64": "int64_t", "int32": "int32_t",
         "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t", "bool": "uint8_t",
         "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
         # low-precision dtypes: raw storage codes (kernels/lowp.h converts; only cast and data movement touch them)
         "bfloat16": "uint16_t", "float8_e4m3fn": "uint8_t", "float8_e4m3fnuz": "uint8_t", "float8_e5m2": "uint8_t",
         "float8_e5m2fnuz": "uint8_t", "float4_e2m1fn": "uint8_t", "int4": "uint8_t", "uint4": "uint8_t",
         "int2": "uint8_t", "uint2": "uint8_t"}
LOWP = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float4_e2m1fn",
        "int4", "uint4", "int2", "uint2")

# type in which pointwise math is done (fp16 computes in float)
COMPUTE = dict(CTYPE, float16="float")


def is_float(dtype):
    return dtype.startswith("float")

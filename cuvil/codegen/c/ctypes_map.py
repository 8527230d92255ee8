"""C types of IR dtypes."""
CTYPE = {"float32": "float", "float64": "double", "float16": "_Float16", "int64": "int64_t", "int32": "int32_t",
         "int16": "int16_t", "int8": "int8_t", "uint8": "uint8_t", "bool": "uint8_t",
         "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t"}

# type in which pointwise math is done (fp16 computes in float)
COMPUTE = dict(CTYPE, float16="float")


def is_float(dtype):
    return dtype.startswith("float")

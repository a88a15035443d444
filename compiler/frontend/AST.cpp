#include "frontend/AST.h"

namespace meshc::ast {

const char* dtypeName(DType dtype) {
  switch (dtype) {
  case DType::F32:
    return "f32";
  case DType::BF16:
    return "bf16";
  case DType::F16:
    return "f16";
  case DType::I32:
    return "i32";
  }
  return "?";
}

} // namespace meshc::ast

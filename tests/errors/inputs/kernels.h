// Headers for the kernel_*.mesh error cases: functions whose signatures do and do not fit an
// `extern def`.
#pragma once

float scale2(float x);
float takes_two(float x, float y);
int rounds(float x);
float by_pointer(const float* x);
namespace nested {
float hidden(float x);
}

// A header that does not compile.
#pragma once

float broken(float x) { return x + ; }

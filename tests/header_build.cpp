// The same check as header_build.c, compiled as C++17.
#include "header_build.c"

"""kvlab's C++ operators on a CPU, beneath the engine and the serving engine: the library `kvlab`.

  csrc/              the C++, shipped as package data: vec.h (the eight-lane vector types and helpers),
                     paged_attention.cpp, linear.cpp, greedy_pick.cpp (an operator each, what it
                     computes and how at its head), ops.h and ops.cpp (the one registration, TORCH_LIBRARY)
  loader.py          the C++ compiler found, the library built once per machine, kept, loaded, its
                     operators' shapes registered for the compiler; `library()`, `usable(pool_keys)`
  ops.py             typed wrappers: paged_attention, linear, linear_panels, panel_width, greedy_pick
                     (torch.ops.kvlab.*), and the shapes the compiler traces

kvlab.serving.compiled_step calls the three operators from its compiled graph; kvlab.engine.step calls
`linear` where the packed weights carry its panels (the serving step's products) and lays them out
(`linear_panels`, once per copy of the weights). The operators keep no state: each result is a function
of its inputs. It imports nothing of kvlab.
"""

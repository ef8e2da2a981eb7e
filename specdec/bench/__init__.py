"""The measuring tooling: the speed benchmark and its reports, profiling, γ from the machine, the ceiling, the peer
benchmark, the accelerator check and the T5-XXL memory and training plans. They use the library; of the library,
only the launcher (`specdec.main`, whose benchmark mode is the main job) imports them."""

"""The single-program shape (Anakin): a JAX env and the algorithm's update compiled into one program per chunk of
updates, vmapped over seeds and split over devices and hosts."""

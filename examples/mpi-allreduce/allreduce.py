"""Sum each rank's number across every rank and host with MPI."""
import os
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank = comm.Get_rank()
total = comm.allreduce(rank + 1)
print("rank %d of %d on %s (SM_CURRENT_HOST=%s): sum %d"
      % (rank, comm.Get_size(), socket.gethostname(), os.environ["SM_CURRENT_HOST"], total))
assert total == comm.Get_size() * (comm.Get_size() + 1) // 2

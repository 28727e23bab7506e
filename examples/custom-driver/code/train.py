import os
import sys

print("rank %s of %s on %s, args %s" % (os.environ["RANK"], os.environ["WORLD_SIZE"],
                                       os.environ["SM_CURRENT_HOST"], sys.argv[1:]))

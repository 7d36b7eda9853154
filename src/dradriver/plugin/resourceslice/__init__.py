"""ResourceSlice publishing (as upstream's Go ``resourceslice`` controller): :mod:`~.publisher` converges the API
server's slices to the pools a driver describes, checked first by :mod:`dradriver.validation.slices`."""

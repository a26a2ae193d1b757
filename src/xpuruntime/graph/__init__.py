"""Graph IR and optimization passes for the inference front end."""

"""What is learned and how it is checked: synthetic tasks, dataset loading, prompt templates,
the verifier, held-out evaluation and the embedded tiny model. Actors and learner both use it;
it uses neither."""
